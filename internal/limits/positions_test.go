package limits

import (
	"os"
	"testing"
)

// TestPositionsLuaIsFresh: the committed positions.lua is what
// PositionsLua renders (run go generate in internal/limits after a change
// of Functions).
func TestPositionsLuaIsFresh(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("positions.lua")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), PositionsLua(); got != want {
		t.Fatalf("positions.lua is stale: run go generate in internal/limits\ngot:\n%s\nwant:\n%s", got, want)
	}
}
