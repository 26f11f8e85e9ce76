// Package web holds the dashboard's templates and static files, embedded so
// that cmd/api serves them with no other file on disk.
package web

import "embed"

// FS holds the static files under static/.
//
//go:embed static
var FS embed.FS
