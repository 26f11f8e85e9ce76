// Package lua holds Tollgate's Redis Function library, as the Lua files it
// is made of, embedded so that the binaries carry them.
//
// The files live here rather than next to their Go runner because go:embed
// cannot reach a parent directory. internal/redisfn (library.go) joins
// them into one library, tollgate_<v> (v: the first 12 hex digits of the
// SHA-256 of its text), loads it with FUNCTION LOAD (Redis 7.0 or later)
// and calls its functions, tg<v>_<name>, with FCALL; cmd/loadgen reads the
// files only to list the commands they run.
//
// The library holds, in this order: a header (KEYS and ARGV, which each
// function sets at its entry, and FN, the functions by name); the files
// the functions share (sharedFiles in internal/redisfn/library.go: the
// calendar, the limit state's hash, pending usage, meter quotas and money,
// late adjustments, the policies' framework and algorithms); then the
// functions, one file each but the two peeks (functions in library.go,
// which names each function's file; each file's opening comment says what
// its function does); and last the registration of each, named for the
// version (the read-only ones flagged no-writes).
//
// A function's definitions are made once, when the library is loaded:
// the files define their helpers at the library's top level (each
// function's private ones in a do ... end block of its file) and per-call
// values are set at a function's entry (Redis runs one function at a
// time). Lua 5.1 bounds a function to 200 locals (the library's chunk
// included) and 60 upvalues.
//
// It holds no Go logic: internal/redisfn loads and calls the library.
package lua

import "embed"

// FS holds the *.lua files.
//
//go:embed *.lua
var FS embed.FS
