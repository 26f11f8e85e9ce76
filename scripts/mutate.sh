#!/usr/bin/env bash
# mutate.sh PKG...: mutation testing of pure packages (no Redis, no Postgres)
# with gremlins. For each package (a directory under the module root) it
# changes one operator at a time (+ to -, < to <=, == to !=, ...), runs the
# package's own tests against each change, and prints the efficacy (the
# share of the changes that the tests caught, among those their code runs)
# and the mutant coverage (the share of the changes whose code the tests
# run). It fails when a package's efficacy is below MUTATE_MIN_EFFICACY
# (90). A package that does not exist is skipped, with a line saying so.
#
# gremlins is installed at a pinned version into .data/bin when missing.
# Each package runs in a copy of the module holding only go.mod, go.sum and
# the package with the module's packages it imports (gremlins copies the
# module once per worker: never .data or bin/), for at most MUTATE_TIMEOUT
# (20m); a single change's tests time out after timeout-coefficient times
# the first test run's duration (scripts/gremlins.yaml).
set -euo pipefail

GREMLINS_VERSION=v0.6.0
min_efficacy=${MUTATE_MIN_EFFICACY:-90}
run_timeout=${MUTATE_TIMEOUT:-20m}

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
gremlins=$root/.data/bin/gremlins
if ! go version -m "$gremlins" 2>/dev/null | grep -q "mod[[:space:]]*github.com/go-gremlins/gremlins[[:space:]]*$GREMLINS_VERSION"; then
	echo "mutate: installing gremlins $GREMLINS_VERSION into .data/bin"
	mkdir -p "$root/.data/bin"
	GOBIN=$root/.data/bin go install "github.com/go-gremlins/gremlins/cmd/gremlins@$GREMLINS_VERSION"
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-mutate.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# The equivalent mutants: gremlins.yaml's list under "equivalent:", one
# '<file> <type> <code>' a line.
equivalents=$(sed -n "/^equivalent:/,/^[^ #]/ s/^  - '\(.*\)'\$/\1/p" scripts/gremlins.yaml | sed "s/''/'/g")

failed=()
for pkg in "$@"; do
	pkg=${pkg#./}
	pkg=${pkg%/}
	if ! compgen -G "$pkg/*.go" >/dev/null; then
		echo "mutate: $pkg: no such package, skipped"
		continue
	fi
	# The copy: go.mod, go.sum, and the module's packages that the
	# package and its tests build from (their files, and testdata).
	work=$stage/${pkg//\//_}
	mkdir -p "$work"
	cp go.mod go.sum "$work/"
	while read -r dir; do
		rel=${dir#"$root"/}
		mkdir -p "$work/$rel"
		find "$dir" -maxdepth 1 -type f -exec cp {} "$work/$rel/" \;
		[ ! -d "$dir/testdata" ] || cp -r "$dir/testdata" "$work/$rel/"
	done < <(go list -deps -test -f '{{if and .Module .Module.Main}}{{.Dir}}{{end}}' "./$pkg" | sort -u)

	echo "mutate: $pkg"
	log=$work.log
	# -count=1: the first test run is timed to set the changes' timeout,
	# and a cached result would make that timeout a fraction of a build.
	if ! (cd "$work" && GOFLAGS=-count=1 timeout "$run_timeout" "$gremlins" unleash \
		--config "$root/scripts/gremlins.yaml" --output-statuses lt "./$pkg") 2>&1 |
		sed -u 's/\x1b\[[0-9;]*m//g' | tee "$log"; then
		echo "mutate: $pkg: gremlins failed or ran past $run_timeout"
		failed+=("$pkg")
		continue
	fi
	read -r killed lived notcov < <(sed -n 's/^Killed: \([0-9]*\), Lived: \([0-9]*\), Not covered: \([0-9]*\).*/\1 \2 \3/p' "$log") || true
	read -r timedout notviable < <(sed -n 's/^Timed out: \([0-9]*\), Not viable: \([0-9]*\).*/\1 \2/p' "$log") || true
	if [ -z "${killed:-}" ] || [ $((killed + lived)) -eq 0 ]; then
		echo "mutate: $pkg: no mutant was run"
		failed+=("$pkg")
		continue
	fi
	# Lived mutants listed as equivalent in gremlins.yaml are not counted.
	equivalent=0
	matched=()
	while read -r status type _ pos; do
		[ "$status" = LIVED ] || continue
		file=${pos%%:*}
		line=${pos#*:}
		line=${line%%:*}
		code=$(sed -n "${line}p" "$work/$pkg/$file" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
		entry="$pkg/$file $type $code"
		if grep -qxF -- "$entry" <<<"$equivalents"; then
			echo "mutate: $pkg: equivalent, not counted: $type at $file:$line"
			equivalent=$((equivalent + 1))
			matched+=("$entry")
		fi
	done < <(grep -E '^ *LIVED ' "$log")
	while read -r entry; do
		case $entry in "$pkg/"*) ;; *) continue ;; esac
		for m in "${matched[@]}"; do [ "$m" != "$entry" ] || continue 2; done
		echo "mutate: $pkg: gremlins.yaml lists as equivalent what no lived mutant is any more: $entry"
	done <<<"$equivalents"
	# efficacy: killed / (killed + lived, less the equivalent ones);
	# mutant coverage: (killed + lived) / all, as gremlins counts it.
	summary=$(awk -v k="$killed" -v l="$lived" -v q="$equivalent" -v n="$notcov" -v min="$min_efficacy" 'BEGIN {
		e = 100 * k / (k + l - q)
		printf "efficacy %.2f %% (%d killed, %d lived), mutant coverage %.2f %% (%d not covered)", e, k, l - q, 100 * (k + l) / (k + l + n), n
		exit (e < min) }') && ok=1 || ok=0
	echo "mutate: $pkg: $summary; $equivalent equivalent, $timedout timed out, $notviable not viable"
	if [ "$ok" = 0 ]; then
		echo "mutate: $pkg: efficacy below $min_efficacy %"
		failed+=("$pkg")
	fi
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "mutate: FAIL: ${failed[*]}"
	exit 1
fi
echo "mutate: PASS"
