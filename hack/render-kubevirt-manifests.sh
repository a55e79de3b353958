#!/usr/bin/env bash
# Renders KubeVirt's release manifests for the real cluster (docs/kubevirt.md)
# the way KubeVirt's own release does: its manifest-templator
# (tools/manifest-templator of kubevirt.io/kubevirt, at the version
# hack/tools/kubevirt pins) fills manifests/release/kubevirt-operator.yaml.in
# from the module, with the images under <registry>/kubevirt at that
# version's tag. (The KubeVirt CR is the user's to write; the cluster
# writes its own, internal/lab/cluster/kubevirt.go.)
#
#   hack/render-kubevirt-manifests.sh REGISTRY OUTDIR
#
# writes OUTDIR/kubevirt-operator.yaml. The
# templator binary is cached outside the clone, keyed by version, like
# hack/build-kubevirt.sh's builds.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 REGISTRY OUTDIR" >&2; exit 2; }
registry=$1 outdir=$2
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${KVNET_CACHE:-/var/cache/kvnet}
mod=$root/hack/tools/kubevirt
log() { echo "render-kubevirt-manifests: $*" >&2; }

version=$(awk '($1 == "require" && $2 == "kubevirt.io/kubevirt") { print $3; exit }' "$mod/go.mod")
[ -n "$version" ] || { log "hack/tools/kubevirt/go.mod requires no kubevirt.io/kubevirt"; exit 1; }
stamp=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-16)
bin="$cache/build/kubevirt-templator-$version-$stamp"
mkdir -p "$cache/build"
if [ ! -f "$bin/.done" ]; then
  exec 9>"$cache/.build-kubevirt-templator.lock"
  flock 9
  if [ ! -f "$bin/.done" ]; then
    log "building KubeVirt's manifest-templator $version"
    rm -rf "$bin.tmp" && mkdir -p "$bin.tmp"
    (cd "$mod" && CGO_ENABLED=0 go build -trimpath -o "$bin.tmp/" kubevirt.io/kubevirt/tools/manifest-templator)
    touch "$bin.tmp/.done"
    rm -rf "$bin" && mv "$bin.tmp" "$bin"
  fi
fi

src=$(cd "$mod" && go list -m -f '{{.Dir}}' kubevirt.io/kubevirt)
mkdir -p "$outdir"
# Two passes, as KubeVirt's hack/build-manifests.sh: the generated
# manifests (CRDs, RBAC) are included first, then the variables filled.
"$bin/manifest-templator" --process-files --generated-manifests-dir="$src/manifests/generated" \
  --input-file="$src/manifests/release/kubevirt-operator.yaml.in" >"$outdir/kubevirt-operator.yaml.in"
"$bin/manifest-templator" --process-vars --namespace=kubevirt \
  --container-prefix="$registry/kubevirt" --container-tag="$version" --image-pull-policy=IfNotPresent \
  --kubevirt-logo-path="$src/assets/kubevirt_logo.png" \
  --input-file="$outdir/kubevirt-operator.yaml.in" >"$outdir/kubevirt-operator.yaml"
rm "$outdir/kubevirt-operator.yaml.in"
log "rendered $outdir/kubevirt-operator.yaml (KubeVirt $version, images $registry/kubevirt)"
