#!/usr/bin/env bash
# Runs the whole test suite (make test). As root every test runs. As any
# other user the unit tests run and the privileged ones (network
# namespaces, nftables, QEMU guests) skip; go test hides a passing
# package's output, so this script ends with one line naming the packages
# whose privileged tests did not run.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

"$GO" test "$@" ./...
rc=$?
if [ "$(id -u)" != 0 ]; then
	# Every package with a test that calls testenv.NeedsRoot (directly,
	# through testenv.NeedsFixture or a helper named needRoot/requirePrivileged).
	pkgs=$(grep -rlE --include='*_test.go' --exclude-dir=.cache 'NeedsRoot\(|NeedsFixture\(|needRoot\(|requirePrivileged\(' . | xargs -n1 dirname | sort -u | sed 's#^\./##' | tr '\n' ' ')
	echo "kvnet: privileged tests NOT RUN (need root; CI runs them as root) in: ${pkgs% }"
fi
exit $rc
