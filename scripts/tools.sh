#!/usr/bin/env bash
# tools.sh — the Go tools the Makefile runs, at pinned versions.
#
#   scripts/tools.sh golangci-lint   prints `export TOLLGATE_GOLANGCI_LINT='…'`, the
#                                    linter of `make lint` and `make test`:
#                                    golangci-lint $GOLANGCI_LINT_VERSION in .data/bin,
#                                    installed there with `go install` when it is
#                                    missing or another version (the module proxy
#                                    serves it; nothing else is downloaded)
#
# An installed tool of the pinned version is used as it is: a second run does
# nothing but check the version (a few milliseconds). Stdout carries only the
# export line; every message goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
bin_dir=$root/.data/bin
golangci_lint_version=${GOLANGCI_LINT_VERSION:-v2.15.0}

exec 3>&1 1>&2

log() { printf 'tools: %s\n' "$*" >&2; }
die() {
	printf 'tools: error: %s\n' "$*" >&2
	exit 1
}
shquote() { printf "'%s'" "${1//\'/\'\\\'\'}"; } # for eval

# install MODULE PACKAGE VERSION NAME: NAME in $bin_dir, built from MODULE's
# PACKAGE at VERSION unless the binary there already is of that version.
install() {
	local module=$1 package=$2 version=$3 name=$4 bin=$bin_dir/$4
	command -v go >/dev/null 2>&1 || die "no go on PATH to install $name"
	if [ -x "$bin" ] && go version -m "$bin" 2>/dev/null |
		grep -q "^[[:space:]]*mod[[:space:]]*$module[[:space:]]*$version[[:space:]]"; then
		return
	fi
	log "installing $name $version into $bin_dir (go install $package@$version)"
	mkdir -p "$bin_dir"
	GOBIN=$bin_dir go install "$package@$version" >&2 || die "go install $package@$version failed"
	go version -m "$bin" 2>/dev/null | grep -q "^[[:space:]]*mod[[:space:]]*$module[[:space:]]*$version[[:space:]]" ||
		die "$bin is not $module $version after go install"
}

case ${1:-} in
golangci-lint)
	install github.com/golangci/golangci-lint/v2 github.com/golangci/golangci-lint/v2/cmd/golangci-lint \
		"$golangci_lint_version" golangci-lint
	echo "export TOLLGATE_GOLANGCI_LINT=$(shquote "$bin_dir/golangci-lint")" >&3
	;;
*)
	die "usage: scripts/tools.sh golangci-lint"
	;;
esac
