// Package migrations holds Tollgate's Postgres schema as golang-migrate SQL
// files, embedded so that the binaries apply them at start.
//
// Each migration has its down step; a released migration is never edited,
// only followed by another.
package migrations

import "embed"

// FS holds the NNNNNN_name.up.sql and .down.sql files.
//
//go:embed *.sql
var FS embed.FS
