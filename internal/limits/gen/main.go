// Command gen writes internal/limits' positions table as Lua
// (limits.PositionsLua): go generate in internal/limits runs it.
package main

import (
	"flag"
	"log"
	"os"

	"github.com/tollgate/tollgate/internal/limits"
)

func main() {
	out := flag.String("o", "positions.lua", "file to write")
	flag.Parse()
	if err := os.WriteFile(*out, []byte(limits.PositionsLua()), 0o600); err != nil {
		log.Fatal(err)
	}
}
