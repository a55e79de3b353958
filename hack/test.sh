#!/usr/bin/env bash
# Runs the whole test suite (make test). As root every test runs. As any
# other user the unit tests run and the privileged ones (network
# namespaces, nftables, QEMU guests) skip; go test hides a passing
# package's output, so this script ends with one line naming the packages
# whose privileged tests did not run.
#
# As root it then runs the real-cluster e2e (internal/lab/cluster, build
# tag "cluster", docs/cluster.md): three nodes with real kubelets,
# containerd, Flannel, Multus (thick, then thin) and CoreDNS, kvnet
# installed from its images, the pod scenarios. Its first run on a machine
# builds kubelet & co. (hack/build-cluster-tools.sh, cached outside the
# clone after); it runs after the rest, alone, because it starts a whole
# cluster on the machine's two cores.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

"$GO" test "$@" ./...
rc=$?
if [ "$(id -u)" = 0 ]; then
	"$GO" test "$@" -tags cluster -run '^TestCluster' ./internal/lab/cluster/ || rc=1
else
	# Every package with a test that calls testenv.NeedsRoot (directly,
	# through testenv.NeedsFixture or a helper named needRoot/requirePrivileged).
	pkgs=$(grep -rlE --include='*_test.go' --exclude-dir=.cache 'NeedsRoot\(|NeedsFixture\(|needRoot\(|requirePrivileged\(' . | xargs -n1 dirname | sort -u | sed 's#^\./##' | tr '\n' ' ')
	echo "kvnet: privileged tests NOT RUN (need root; CI runs them as root) in: ${pkgs% }"
	echo "kvnet: the real-cluster e2e NOT RUN (needs root; CI runs it as root): go test -tags cluster -run '^TestCluster' ./internal/lab/cluster/"
fi
exit $rc
