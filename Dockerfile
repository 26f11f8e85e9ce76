# The api, worker and seed binaries in a small image without a shell.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/ ./cmd/...

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/api /out/worker /out/seed /usr/local/bin/
ENV TOLLGATE_ADDR=0.0.0.0:8080
EXPOSE 8080
CMD ["/usr/local/bin/api"]
