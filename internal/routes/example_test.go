package routes_test

import (
	"fmt"

	"github.com/tollgate/tollgate/internal/routes"
)

func ExampleRoute_Target() {
	tab, err := routes.Parse([]byte(`{"routes": [
		{"method": "*", "path": "/api/files/", "meter": "files", "cost": 1, "upstream": "http://127.0.0.1:9000/v2/"}
	]}`))
	if err != nil {
		panic(err)
	}
	for _, path := range []string{"/api/files/a%20b", "/api/files/group%2Fproject", "/api/files/a/../../admin", "/api/files/%2e%2e/admin"} {
		if r := tab.Match("GET", path); r != nil {
			fmt.Println(path, "->", r.Target(path, "v=1"))
		} else {
			fmt.Println(path, "-> no route")
		}
	}
	// Output:
	// /api/files/a%20b -> http://127.0.0.1:9000/v2/a%20b?v=1
	// /api/files/group%2Fproject -> http://127.0.0.1:9000/v2/group%2Fproject?v=1
	// /api/files/a/../../admin -> no route
	// /api/files/%2e%2e/admin -> no route
}
