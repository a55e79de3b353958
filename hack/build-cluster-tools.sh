#!/usr/bin/env bash
# Builds what the real-cluster lab (kvnet-lab cluster, docs/cluster.md)
# runs beside the lab's control plane, from Go modules only:
#   kubelet, kube-scheduler, kube-proxy   hack/tools/k8s-node (k8s.io/kubernetes,
#                                         the version hack/tools/k8s pins)
#   registry                              hack/tools/registry (distribution v3,
#                                         filesystem storage only: its main.go)
#   bridge, host-local, loopback, ptp,    the CNI plugins of kvnet's go.mod
#   macvlan (KubeVirt's migration network)
#   coredns                               hack/tools/coredns (github.com/coredns/coredns,
#                                         the lab's plugins only: its main.go)
#   flanneld                              hack/tools/flannel (github.com/flannel-io/flannel)
#   flannel, portmap (CNI)                hack/tools/flannel-cni (containernetworking/plugins v0.9.1)
#   multus-daemon, multus-shim, multus,   hack/tools/multus
#   install_multus, passthru,             (gopkg.in/k8snetworkplumbingwg/multus-cni.v4)
#   thin_entrypoint
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
stamp_of() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-16; }

k8s_node=$root/hack/tools/k8s-node
k8s_version=$(pin "$k8s_node" k8s.io/kubernetes)
cp_version=$(pin "$root/hack/tools/k8s" k8s.io/kubernetes)
if [ "$k8s_version" != "$cp_version" ]; then
  log "hack/tools/k8s-node pins k8s.io/kubernetes $k8s_version but the control plane (hack/tools/k8s) $cp_version: pin the same version in both"
  exit 1
fi
registry_mod=$root/hack/tools/registry
registry_version=$(pin "$registry_mod" github.com/distribution/distribution/v3)
cni_version=$(pin "$root" github.com/containernetworking/plugins)
coredns_mod=$root/hack/tools/coredns
coredns_version=$(pin "$coredns_mod" github.com/coredns/coredns)
flannel_mod=$root/hack/tools/flannel
flannel_version=$(pin "$flannel_mod" github.com/flannel-io/flannel)
flannel_cni_mod=$root/hack/tools/flannel-cni
flannel_cni_version=$(pin "$flannel_cni_mod" github.com/containernetworking/plugins)
multus_mod=$root/hack/tools/multus
multus_version=$(pin "$multus_mod" gopkg.in/k8snetworkplumbingwg/multus-cni.v4)

# build GROUP VERSION MODDIR STAMP LDFLAGS PACKAGES...: go build PACKAGES in
# MODDIR into the group's cache directory unless it is there already.
# RENAME=FROM:TO in its environment renames binary FROM to TO; CGO=1 builds
# with cgo (LDFLAGS then link statically, so that the binary runs in an
# image without a C library).
build() {
  local group=$1 version=$2 dir=$3 stamp=$4 ldflags=$5; shift 5
  stamp=$(echo "$stamp $ldflags" | sha256sum | cut -c1-16)
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
    (cd "$dir" && CGO_ENABLED=${CGO:-0} go build -trimpath -ldflags="$ldflags" -o "$out.tmp/" "$@")
    # RENAME=FROM:TO renames a binary whose package name clashes with another's.
    if [ -n "${RENAME:-}" ]; then mv "$out.tmp/${RENAME%%:*}" "$out.tmp/${RENAME#*:}"; fi
    touch "$out.tmp/.done"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    cpu_s
    log "built $group in $((SECONDS - start))s wall, $((cpu - cpu0))s CPU (user+sys)"
  fi
  dirs+=("$out")
}

# The Kubernetes binaries report their version (kubectl get nodes shows
# the kubelet's) from these variables, which make sets in a release build.
minor=${k8s_version#v1.}
minor=${minor%%.*}
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

dirs=()
# The node binaries are built with the cgo setting hack/build-tools.sh
# builds the control plane with (go's default: it sets none), so that the
# two builds share every compiled k8s.io package of the version both pin
# in the Go build cache: cgo changes package net's build, and with it the
# cache key of everything that imports it. The kubelet, kube-proxy and
# kube-scheduler run on the host (in the nodes' namespaces), never in an
# image, so a binary linked against the host's C library runs.
CGO=$(go env CGO_ENABLED) build k8s-node "$k8s_version" "$k8s_node" "$(stamp_of "$k8s_node")" "$k8s_ldflags" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy
# registry and coredns are main packages of the repo's own (main.go) that
# link only what the lab uses: main.go is part of their stamps.
registry_stamp=$(cat "$registry_mod/go.mod" "$registry_mod/go.sum" "$registry_mod/main.go" | sha256sum | cut -c1-16)
build registry "$registry_version" "$registry_mod" "$registry_stamp" "-s -w" \
  kvnet.io/kvnet/hack/tools/registry
# The CNI plugins come from kvnet's own module: its go.sum pins them. The
# stamp names the plugins too, so adding one builds the group anew.
cni_pkgs=(
  github.com/containernetworking/plugins/plugins/main/bridge
  github.com/containernetworking/plugins/plugins/ipam/host-local
  github.com/containernetworking/plugins/plugins/main/loopback
  github.com/containernetworking/plugins/plugins/main/ptp
  github.com/containernetworking/plugins/plugins/main/macvlan
)
build cni-plugins "$cni_version" "$root" "$( (grep "^github.com/containernetworking/plugins $cni_version " "$root/go.sum"; echo "${cni_pkgs[*]}") | sha256sum | cut -c1-16)" "-s -w" \
  "${cni_pkgs[@]}"
coredns_stamp=$(cat "$coredns_mod/go.mod" "$coredns_mod/go.sum" "$coredns_mod/main.go" | sha256sum | cut -c1-16)
build coredns "$coredns_version" "$coredns_mod" "$coredns_stamp" "-s -w" \
  kvnet.io/kvnet/hack/tools/coredns
# flanneld reports its version from this variable; the stand-in module
# it builds with (hack/tools/flannel/tencentvpc) is part of the stamp. Its
# udp backend is cgo (as upstream, linked statically).
flannel_stamp=$(cat "$flannel_mod/go.mod" "$flannel_mod/go.sum" "$flannel_mod"/tencentvpc/go.mod "$flannel_mod"/tencentvpc/*/*.go | sha256sum | cut -c1-16)
CGO=1 RENAME=flannel:flanneld build flannel "$flannel_version" "$flannel_mod" "$flannel_stamp" \
  "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$flannel_version -linkmode external -extldflags -static" \
  github.com/flannel-io/flannel
build flannel-cni "$flannel_cni_version" "$flannel_cni_mod" "$(stamp_of "$flannel_cni_mod")" "-s -w" \
  github.com/containernetworking/plugins/plugins/meta/flannel github.com/containernetworking/plugins/plugins/meta/portmap
# Multus reports its version from these variables (multus-daemon -version).
# tools.go lists the commands: it is part of the stamp.
multus_pkg=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus
multus_stamp=$(cat "$multus_mod/go.mod" "$multus_mod/go.sum" "$multus_mod/tools.go" | sha256sum | cut -c1-16)
RENAME=passthru-cni:passthru build multus "$multus_version" "$multus_mod" "$multus_stamp" \
  "-s -w -X $multus_pkg.version=$multus_version -X $multus_pkg.gitTreeState=clean" \
  gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus \
  gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon \
  gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim \
  gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/install_multus \
  gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/passthru-cni \
  gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/thin_entrypoint

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
