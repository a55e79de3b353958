#!/usr/bin/env bash
# Builds KubeVirt's binaries for the real cluster's KubeVirt images
# (docs/kubevirt-images.md) from the Go module kubevirt.io/kubevirt at the
# version hack/tools/kubevirt pins:
#   virt-operator, virt-api, virt-controller   static (CGO off), as KubeVirt's
#                                              own build links them
#   virt-handler, virt-chroot, virt-launcher   cgo: virt-launcher links
#                                              libvirt (Debian's libvirt-dev),
#                                              virt-handler's node labeller
#                                              and virt-chroot use cgo
#   virt-launcher-monitor, virt-freezer, virt-probe, virt-tail   (CGO off)
#   container-disk                             KubeVirt's C helper
#                                              (cmd/container-disk-v2alpha),
#                                              gcc -static from its source
#   node-labeller.sh                           a script virt-launcher's image
#                                              carries, copied from the source
# Packages: hack/install-deps.sh --kubevirt.
#
# Cached OUTSIDE the clone, keyed by version, like hack/build-cluster-tools.sh:
#   ${KVNET_CACHE:-/var/cache/kvnet}/build/kubevirt-<version>-<stamp>/
# where <stamp> hashes hack/tools/kubevirt's go.mod and go.sum and this
# script. Prints that directory as its only line on stdout; progress goes
# to stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${KVNET_CACHE:-/var/cache/kvnet}
mod=$root/hack/tools/kubevirt
mkdir -p "$cache/build"
log() { echo "build-kubevirt: $*" >&2; }
die() { echo "build-kubevirt: error: $*" >&2; exit 1; }

version=$(awk '($1 == "require" && $2 == "kubevirt.io/kubevirt") { print $3; exit }' "$mod/go.mod")
[ -n "$version" ] || die "hack/tools/kubevirt/go.mod requires no kubevirt.io/kubevirt"
stamp=$(cat "$mod/go.mod" "$mod/go.sum" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
out="$cache/build/kubevirt-$version-$stamp"
if [ -f "$out/.done" ]; then
  log "kubevirt $version up to date ($out)"
  echo "$out"
  exit 0
fi

command -v gcc >/dev/null || die "gcc not found: run hack/install-deps.sh --kubevirt"
[ -f /usr/include/libvirt/libvirt.h ] || die "libvirt/libvirt.h not found: install Debian package libvirt-dev (hack/install-deps.sh --kubevirt)"

# One build at a time: parallel tests and CI may all ask.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/.build-kubevirt.lock"
  flock 9
  if [ -f "$out/.done" ]; then
    echo "$out"
    exit 0
  fi
fi

log "building kubevirt $version into $out (first run takes many minutes)"
start=$SECONDS
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
# KubeVirt's binaries report their version (virt-operator puts it in the
# KubeVirt CR's status) from these variables, which its release build sets.
ldflags="-s -w"
for kv in "gitVersion=$version" gitTreeState=clean buildDate=1970-01-01T00:00:00Z; do
  ldflags+=" -X kubevirt.io/client-go/version.$kv"
done
gobuild() {
  local cgo=$1; shift
  (cd "$mod" && CGO_ENABLED=$cgo go build -trimpath -ldflags="$ldflags" -o "$out.tmp/" "$@")
}
k=kubevirt.io/kubevirt/cmd
gobuild 0 $k/virt-operator $k/virt-api $k/virt-controller \
  $k/virt-launcher-monitor $k/virt-freezer $k/virt-probe $k/virt-tail
gobuild 1 $k/virt-handler $k/virt-chroot $k/virt-launcher

src=$(cd "$mod" && go list -m -f '{{.Dir}}' kubevirt.io/kubevirt)
[ -f "$src/cmd/container-disk-v2alpha/main.c" ] || die "no cmd/container-disk-v2alpha/main.c in $src"
gcc -O2 -static -o "$out.tmp/container-disk" "$src/cmd/container-disk-v2alpha/main.c"
install -m 0755 "$src/cmd/virt-launcher/node-labeller/node-labeller.sh" "$out.tmp/node-labeller.sh"
echo "$version" >"$out.tmp/.version"
touch "$out.tmp/.done"
rm -rf "$out"
mv "$out.tmp" "$out"
log "built kubevirt $version in $((SECONDS - start))s"
echo "$out"
