// Package web holds the dashboard's templates and static files, embedded so
// that cmd/api serves them with no other file on disk.
package web

import "embed"

// FS holds the page templates under templates/ and the static files
// (stylesheet, script, robots.txt) under static/.
//
//go:embed templates static
var FS embed.FS
