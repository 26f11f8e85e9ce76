// Command worker reconciles usage counted in Redis into Postgres and bills it
// (internal/app, RunWorker).
package main

import (
	"os"

	"github.com/tollgate/tollgate/internal/app"
)

func main() {
	os.Exit(app.Main("worker", app.RunWorker))
}
