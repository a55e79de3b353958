#!/usr/bin/env bash
# Runs every fuzz target of the module (make fuzz), one at a time, for
# FUZZTIME each (default 60s; go's -fuzztime, so "1000x" works too), and
# prints one summary line per target. Exits non-zero when any target fails;
# go keeps the failing input under the package's testdata/fuzz/<target>/,
# which is committed with the fix as a regression.
#
# FUZZ=<regexp> runs only the targets whose "<package dir> <target>" line
# matches, e.g. FUZZ=internal/cni or FUZZ=FuzzRender.
#
# Targets are found by grep, not "go test -list": listing runs each test
# binary, and some packages' TestMain starts a control plane unless fuzzing.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
fuzztime=${FUZZTIME:-60s}
logs=.cache/fuzz
mkdir -p "$logs"

mapfile -t targets < <(
	grep -rEo --include='*_test.go' --exclude-dir=.cache --exclude-dir=vendor '^func Fuzz[A-Za-z0-9_]*\(' . |
		sed -E 's#^\./(.*)/[^/]+:func (Fuzz[A-Za-z0-9_]*)\($#\1 \2#' | sort -u | grep -E -- "${FUZZ:-.}"
)
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets match FUZZ=${FUZZ:-}" >&2
	exit 1
fi

echo "fuzz: ${#targets[@]} targets, $fuzztime each; logs in $logs/"
failed=0
summary=()
for t in "${targets[@]}"; do
	dir=${t% *} name=${t#* }
	log="$logs/${dir//\//_}.$name.log"
	start=$SECONDS
	note=""
	for attempt in 1 2; do
		"$GO" test -run '^$' -fuzz "^$name\$" -fuzztime "$fuzztime" "./$dir" >"$log" 2>&1
		rc=$?
		# Go's fuzz coordinator can fail a target at the -fuzztime deadline
		# with a bare "context deadline exceeded" and no failing input
		# (golang/go#75804, fixed after go1.26). That says nothing about
		# our code: run the target once more, in full, and say so.
		if [ $rc != 0 ] && [ $attempt = 1 ] && grep -q '^    context deadline exceeded$' "$log" &&
			! grep -q 'Failing input written to' "$log"; then
			note="  (rerun: the first run hit golang/go#75804, no failing input)"
			continue
		fi
		break
	done
	execs=$(grep -Eo 'execs: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+')
	line=$(printf '%-4s %-34s %-22s %5ss %12s execs%s' "$([ $rc = 0 ] && echo ok || echo FAIL)" "$dir" "$name" "$((SECONDS - start))" "${execs:-0}" "$note")
	if [ $rc != 0 ]; then
		failed=$((failed + 1))
		crasher=$(grep -Eo 'testdata/fuzz/[^ ]+' "$log" | tail -1)
		line+="  (log: $log${crasher:+; input: $dir/$crasher})"
		tail -n 30 "$log"
	fi
	echo "$line"
	summary+=("$line")
done

echo
echo "fuzz summary ($fuzztime per target):"
printf '%s\n' "${summary[@]}"
if [ $failed != 0 ]; then
	echo "fuzz: $failed of ${#targets[@]} targets FAILED"
	exit 1
fi
echo "fuzz: all ${#targets[@]} targets passed"
