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
# clone after: in the background, below); it runs after the rest, alone,
# because it starts a whole cluster on the machine's two cores. Last comes
# the real-KubeVirt e2e (build tags "cluster,kubevirt", docs/kubevirt.md):
# KubeVirt v1.8.4 built from its Go module and installed on a new real
# cluster, the VM scenarios, a drain, a rollback and upgrade of kvnet.
# KubeVirt's binaries and root file system are built in the background
# too, after the cluster's binaries, and cached outside the clone.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
cluster_e2e=(-tags cluster -run '^TestCluster' ./internal/lab/cluster/)
# Its own limit: it may build KubeVirt itself (the background build
# failed) before its 15-20 minutes, and it bounds its own run at 55.
kubevirt_e2e=(-tags cluster,kubevirt -run '^TestClusterKubeVirt$' -timeout 60m ./internal/lab/cluster/)

if [ "$(id -u)" = 0 ]; then
	# The cluster's binaries build in the background at the lowest CPU
	# priority while the suite runs: its long packages wait on guests and
	# clusters more than they compute, and the build takes the idle CPU
	# (measured: 40% idle while test/e2e ran alone, test/chaos still in
	# it; docs/cluster.md). The test runs the script again, which then
	# finds them built or waits for this build (it takes a lock).
	prebuild_log=$(mktemp)
	nice -n 19 hack/build-cluster-tools.sh >/dev/null 2>"$prebuild_log" &
	prebuild=$!
	# KubeVirt's binaries (Go, some cgo) after the cluster's binaries, so
	# that those are ready first; its images' Debian root file system
	# (downloads, mostly) at once, beside them. The KubeVirt e2e builds
	# what these did not (the scripts take locks, and cache what they
	# built).
	# Each is bounded, so that a stalled download cannot hold the run:
	# the e2e builds again what did not finish.
	kv_prebuild_log=$(mktemp)
	timeout 45m nice -n 19 hack/build-kubevirt-rootfs.sh >/dev/null 2>>"$kv_prebuild_log" &
	kv_rootfs=$!
	(
		wait_for=$prebuild
		while kill -0 "$wait_for" 2>/dev/null; do sleep 5; done
		timeout 45m nice -n 19 hack/build-kubevirt.sh >/dev/null
	) 2>>"$kv_prebuild_log" &
	kv_prebuild=$!
fi
# The suite's output is kept too, for the summary of times at the end
# (CI shows the beginning and the end of a long output).
suite_log=$(mktemp)
t0=$SECONDS
"$GO" test "$@" ./... 2>&1 | tee "$suite_log"
rc=${PIPESTATUS[0]}
times="suite $((SECONDS - t0)) s"
if [ "$(id -u)" = 0 ]; then
	if wait "$prebuild"; then
		# What it built and what that took (CPU seconds; its wall time
		# ran beside the suite).
		grep '^build-cluster-tools: ' "$prebuild_log"
	else
		echo "kvnet: hack/build-cluster-tools.sh failed in the background (the real-cluster test runs it again):"
		cat "$prebuild_log"
	fi
	rm -f "$prebuild_log"
	# The e2e tests run kvnet, the cluster and KubeVirt as processes of
	# their own: -race would instrument only the tests' harness, at a
	# cost of minutes, so they run without it, and are compiled as
	# every other non-race build here is (internal/repo.GoBuild, and
	# make verify's vet): static and -trimpath, one configuration in the
	# Go build cache.
	e2e_args=(-trimpath)
	for a in "$@"; do
		[ "$a" = -race ] || e2e_args+=("$a")
	done
	# The root file system's build (debootstrap: downloads, dpkg, a
	# 256 MB tar) must not run beside the clusters: nice does not spare
	# them its disk and its processes, and beside it the pods' probes
	# and the policy matrix's timed out (measured 2026-12-02; they
	# passed alone). It started with the suite, so it has ended by now
	# but on a slow network.
	wait "$kv_rootfs"
	rootfs_rc=$?
	t0=$SECONDS
	CGO_ENABLED=0 "$GO" test "${e2e_args[@]}" "${cluster_e2e[@]}" || rc=1
	times+=", real-cluster e2e $((SECONDS - t0)) s"
	if wait "$kv_prebuild" && [ "$rootfs_rc" = 0 ]; then
		grep -E '^build-kubevirt(-rootfs)?: ' "$kv_prebuild_log" | grep -E 'up to date|took|CPU|built' || true
	else
		echo "kvnet: KubeVirt's background build failed (the KubeVirt e2e builds again):"
		tail -n 40 "$kv_prebuild_log"
	fi
	rm -f "$kv_prebuild_log"
	t0=$SECONDS
	CGO_ENABLED=0 "$GO" test "${e2e_args[@]}" "${kubevirt_e2e[@]}" || rc=1
	times+=", real-KubeVirt e2e $((SECONDS - t0)) s"
else
	# Every package with a test that calls testenv.NeedsRoot (directly,
	# through testenv.NeedsFixture or a helper named needRoot/requirePrivileged).
	pkgs=$(grep -rlE --include='*_test.go' --exclude-dir=.cache 'NeedsRoot\(|NeedsFixture\(|needRoot\(|requirePrivileged\(' . | xargs -n1 dirname | sort -u | sed 's#^\./##' | tr '\n' ' ')
	echo "kvnet: privileged tests NOT RUN (need root; CI runs them as root) in: ${pkgs% }"
	echo "kvnet: the real-cluster e2e NOT RUN (needs root; CI runs it as root): go test ${cluster_e2e[*]}"
	echo "kvnet: the real-KubeVirt e2e NOT RUN (needs root; CI runs it as root): go test ${kubevirt_e2e[*]}"
fi
# Where the time went: the phases' wall times and the suite's slowest
# packages (go test's own time for each).
echo "kvnet: wall times: $times; the suite's slowest packages:"
awk '($1 == "ok" || $1 == "FAIL") && $3 ~ /^[0-9.]+s$/ { sub(/s$/, "", $3); print $3, $2 }' "$suite_log" |
	sort -rn | head -n 8 | awk '{ printf "  %8.1f s  %s\n", $1, $2 }'
rm -f "$suite_log"
exit $rc
