#!/usr/bin/env bash
# Builds what the real-cluster lab (kvnet-lab cluster, docs/cluster.md)
# runs beside the lab's control plane, from Go modules only:
#   hack/tools/cluster (one module, so that they share one version of every
#   module, and the Go build cache one compile of each package, with the
#   control plane of hack/tools/k8s):
#     kubelet, kube-scheduler, kube-proxy   k8s.io/kubernetes (the version
#                                           hack/tools/k8s pins)
#     registry                              ./registry (distribution v3,
#                                           filesystem storage only)
#     coredns                               ./coredns (github.com/coredns/coredns,
#                                           the lab's plugins only)
#     flanneld                              github.com/flannel-io/flannel
#     multus-daemon, multus-shim, multus,   gopkg.in/k8snetworkplumbingwg/multus-cni.v4
#     install_multus, passthru,
#     thin_entrypoint
#   bridge, host-local, loopback, ptp,    the CNI plugins of kvnet's go.mod
#   macvlan (KubeVirt's migration network)
#   flannel, portmap (CNI)                hack/tools/flannel-cni (containernetworking/plugins v0.9.1)
# containerd and runc are Debian's (hack/install-deps.sh --cluster).
#
# Builds are cached OUTSIDE the clone, keyed by version, so that fresh
# clones on the same machine (CI's) reuse them:
#   ${KVNET_CACHE:-/var/cache/kvnet}/build/<group>-<version>-<stamp>/
# where <stamp> hashes the pinning go.mod and go.sum. The existing
# control-plane tools (hack/build-tools.sh, .cache/bin) are not touched.
#
# Prints, as its only line on stdout, a directory of symlinks to every
# binary (kvnet-lab cluster up --bin-dir takes it); progress goes to stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${KVNET_CACHE:-/var/cache/kvnet}
mkdir -p "$cache/build" "$cache/sets"
# One build at a time: parallel test packages and CI may all ask.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/.build.lock"
  flock 9
fi
log() { echo "build-cluster-tools: $*" >&2; }
# cpu_s: sets cpu to the user+sys CPU seconds of this shell's finished
# children so far (bash's times, run in this shell: a subshell would
# count only its own).
cpu_file=$(mktemp)
trap 'rm -f "$cpu_file"' EXIT
cpu_s() {
  times >"$cpu_file"
  cpu=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } printf "%d", t }' "$cpu_file")
}

# pin MODDIR MODULE: the version MODDIR's go.mod requires of MODULE.
pin() { awk -v m="$2" '($1 == m || ($1 == "require" && $2 == m)) { print ($1 == "require" ? $3 : $2); exit }' "$1/go.mod"; }

cluster_mod=$root/hack/tools/cluster
k8s_version=$(pin "$cluster_mod" k8s.io/kubernetes)
cp_version=$(pin "$root/hack/tools/k8s" k8s.io/kubernetes)
if [ "$k8s_version" != "$cp_version" ]; then
  log "hack/tools/cluster pins k8s.io/kubernetes $k8s_version but the control plane (hack/tools/k8s) $cp_version: pin the same version in both"
  exit 1
fi
registry_version=$(pin "$cluster_mod" github.com/distribution/distribution/v3)
coredns_version=$(pin "$cluster_mod" github.com/coredns/coredns)
flannel_version=$(pin "$cluster_mod" github.com/flannel-io/flannel)
multus_version=$(pin "$cluster_mod" gopkg.in/k8snetworkplumbingwg/multus-cni.v4)
cni_version=$(pin "$root" github.com/containernetworking/plugins)
flannel_cni_mod=$root/hack/tools/flannel-cni
flannel_cni_version=$(pin "$flannel_cni_mod" github.com/containernetworking/plugins)

# build GROUP VERSION STAMP STEPS [ARGS...]: unless the group's cache
# directory is there already, runs STEPS OUT ARGS... to fill a new one (OUT)
# and logs the wall and CPU time it took.
build() {
  local group=$1 version=$2 stamp=$3; shift 3
  local out="$cache/build/$group-$version-$stamp"
  if [ -f "$out/.done" ]; then
    log "$group $version up to date ($out)"
  else
    log "building $group $version into $out (first run takes minutes)"
    local start=$SECONDS cpu0
    cpu_s
    cpu0=$cpu
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    "$1" "$out.tmp" "${@:2}"
    touch "$out.tmp/.done"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    cpu_s
    log "built $group in $((SECONDS - start))s wall, $((cpu - cpu0))s CPU (user+sys)"
  fi
  dirs+=("$out")
}

# go_build OUT MODDIR LDFLAGS PACKAGES...: go build PACKAGES in MODDIR into
# OUT, logging the step's wall and CPU time. CGO=1 in its environment
# builds with cgo; RENAME=FROM:TO renames binary FROM to TO (a package name
# that clashes with another's, or is not the command's name).
go_build() {
  local out=$1 dir=$2 ldflags=$3; shift 3
  local start=$SECONDS cpu0
  cpu_s
  cpu0=$cpu
  (cd "$dir" && CGO_ENABLED=${CGO:-0} go build -trimpath -ldflags="$ldflags" -o "$out/" "$@")
  if [ -n "${RENAME:-}" ]; then mv "$out/${RENAME%%:*}" "$out/${RENAME#*:}"; fi
  cpu_s
  local what
  what=$(basename "$1")
  if [ $# -gt 1 ]; then what+=" and $(($# - 1)) more"; fi
  log "  $what: $((SECONDS - start))s wall, $((cpu - cpu0))s CPU"
}

# The Kubernetes binaries report their version (kubectl get nodes shows
# the kubelet's) from these variables, which make sets in a release build.
minor=${k8s_version#v1.}
minor=${minor%%.*}
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
# Binaries that run in an image without a C library are linked statically.
static="-linkmode external -extldflags -static"
# flanneld and Multus report their versions from these variables
# (flanneld --version, multus-daemon -version).
multus_pkg=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus
flannel_ldflags="-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$flannel_version $static"
multus_ldflags="-s -w -X $multus_pkg.version=$multus_version -X $multus_pkg.gitTreeState=clean $static"

# cluster_steps OUT: every command of hack/tools/cluster, with cgo, as
# hack/build-tools.sh builds the control plane (Go's default where a C
# compiler is: it sets none). cgo changes the build of package net, and
# with it the cache key of every package that imports it, so one setting
# for all is what lets the Go build cache compile each shared package once
# (flanneld needs cgo anyway: its udp backend). The kubelet, kube-proxy,
# kube-scheduler and the registry run on the host and link its C library;
# the others run in images and are linked statically.
cluster_steps() {
  local out=$1
  log "  Kubernetes $k8s_version, registry $registry_version, CoreDNS $coredns_version, Flannel $flannel_version, Multus $multus_version"
  CGO=1 go_build "$out" "$cluster_mod" "$k8s_ldflags" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy
  CGO=1 go_build "$out" "$cluster_mod" "-s -w" ./registry
  CGO=1 go_build "$out" "$cluster_mod" "-s -w $static" ./coredns
  CGO=1 RENAME=flannel:flanneld go_build "$out" "$cluster_mod" "$flannel_ldflags" github.com/flannel-io/flannel
  CGO=1 RENAME=passthru-cni:passthru go_build "$out" "$cluster_mod" "$multus_ldflags" \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/install_multus \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/passthru-cni \
    gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/thin_entrypoint
}

# plain_steps OUT MODDIR PACKAGES...: go build PACKAGES in MODDIR, no cgo.
plain_steps() { go_build "$1" "$2" "-s -w" "${@:3}"; }

dirs=()
# The stamp covers the module, the repo's own sources in it and the
# recipe (this script's link flags).
cluster_stamp=$( (cd "$cluster_mod" && cat go.mod go.sum tools.go coredns/main.go registry/main.go tencentvpc/go.mod tencentvpc/*/*.go; echo "$k8s_ldflags $static $flannel_ldflags $multus_ldflags") | sha256sum | cut -c1-16)
build cluster "$k8s_version" "$cluster_stamp" cluster_steps
# The CNI plugins come from kvnet's own module: its go.sum pins them. The
# stamp names the plugins too, so adding one builds the group anew.
cni_pkgs=(
  github.com/containernetworking/plugins/plugins/main/bridge
  github.com/containernetworking/plugins/plugins/ipam/host-local
  github.com/containernetworking/plugins/plugins/main/loopback
  github.com/containernetworking/plugins/plugins/main/ptp
  github.com/containernetworking/plugins/plugins/main/macvlan
)
build cni-plugins "$cni_version" "$( (grep "^github.com/containernetworking/plugins $cni_version " "$root/go.sum"; echo "${cni_pkgs[*]} -s -w") | sha256sum | cut -c1-16)" \
  plain_steps "$root" "${cni_pkgs[@]}"
build flannel-cni "$flannel_cni_version" "$( (cat "$flannel_cni_mod/go.mod" "$flannel_cni_mod/go.sum"; echo "-s -w") | sha256sum | cut -c1-16)" \
  plain_steps "$flannel_cni_mod" github.com/containernetworking/plugins/plugins/meta/flannel github.com/containernetworking/plugins/plugins/meta/portmap

# busybox for the workload image: Debian's busybox-static, the candidate
# version, downloaded (not installed: it conflicts with package busybox)
# and unpacked.
bb_version=$(apt-cache policy busybox-static 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" { print $2 }')
if [ -z "$bb_version" ]; then
  log "apt knows no busybox-static: run apt-get update"
  exit 1
fi
bb_out="$cache/build/busybox-static-${bb_version//[:~+]/_}"
if [ -f "$bb_out/.done" ]; then
  log "busybox-static $bb_version up to date ($bb_out)"
else
  log "downloading busybox-static $bb_version"
  work=$(mktemp -d)
  chmod 0755 "$work" # apt-get download writes as its sandbox user _apt
  if [ "$(id -u)" = 0 ] && id _apt >/dev/null 2>&1; then chown _apt "$work"; fi
  (cd "$work" && apt-get download -q "busybox-static=$bb_version" >&2)
  dpkg-deb -x "$work"/busybox-static_*.deb "$work/x"
  rm -rf "$bb_out"
  mkdir -p "$bb_out"
  cp "$work/x/bin/busybox" "$bb_out/busybox"
  touch "$bb_out/.done"
  rm -rf "$work"
fi
dirs+=("$bb_out")

# The set: one directory of symlinks named by the builds it holds.
set_id=$(printf '%s\n' "${dirs[@]}" | sha256sum | cut -c1-16)
set_dir="$cache/sets/$set_id"
if [ ! -d "$set_dir" ]; then
  mkdir -p "$set_dir.tmp"
  for d in "${dirs[@]}"; do
    for f in "$d"/*; do ln -sfn "$f" "$set_dir.tmp/$(basename "$f")"; done
  done
  rm -rf "$set_dir"
  mv "$set_dir.tmp" "$set_dir"
fi
echo "$set_dir"
