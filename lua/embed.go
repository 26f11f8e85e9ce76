// Package lua holds Tollgate's Redis scripts, embedded so that the binaries
// carry them and load them with SCRIPT LOAD / EVALSHA at run time.
//
// The scripts live here rather than next to their Go runner because go:embed
// cannot reach a parent directory; internal/ratelimit reads them from FS.
package lua

import "embed"

// FS holds the *.lua scripts: admit.lua (the admission decision) and
// grant.lua (extra units for the current day or month).
//
//go:embed *.lua
var FS embed.FS
