package admin

//go:generate go run ../internal/cmd/genadmin -spec ../../../internal/httpapi/openapi.json -config oapi-codegen.yaml -o admin.gen.go
