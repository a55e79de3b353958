#!/usr/bin/env bash
# Builds the control-plane binaries kvnet's tests and lab run (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler), helm (the
# chart's tests) and kwok (the scale lab's simulated nodes) from their Go
# modules, pinned in hack/tools/{etcd,k8s,helm,kwok}/go.mod, into
# .cache/bin. A stamp of the pinned
# versions makes the next run a no-op until a pin changes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVNET_BIN_DIR:-$root/.cache/bin}
mkdir -p "$bin"

# The Kubernetes binaries report their version (the API server's /version,
# which kvnet check reads) from these variables, which make sets in a
# release build; without them kube-apiserver says v0.0.0-master.
k8s_version=$(awk '($1 == "require" && $2 == "k8s.io/kubernetes") || $1 == "k8s.io/kubernetes" { print ($1 == "require" ? $3 : $2); exit }' "$root/hack/tools/k8s/go.mod")
minor=${k8s_version#v1.}
minor=${minor%%.*}
k8s_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

stamp_of() { # stamp_of <module dir> <packages...>
  local dir=$1; shift
  { cat "$root/hack/tools/$dir/go.mod" "$root/hack/tools/$dir/go.sum"; echo "$LDFLAGS"; echo "$*"; } | sha256sum | cut -c1-16
}

build() { # [LDFLAGS=...] build <module dir> <stamp name> <-o target> <packages...>
  local dir=$1 name=$2 out=$3; shift 3
  local want; want=$(stamp_of "$dir" "$@")
  if [ -f "$bin/.$name.stamp" ] && [ "$(cat "$bin/.$name.stamp")" = "$want" ]; then
    echo "build-tools: $name up to date"
    return
  fi
  echo "build-tools: building $name (first run takes several minutes)"
  (cd "$root/hack/tools/$dir" && go build -trimpath -ldflags="$LDFLAGS" -o "$out" "$@")
  echo "$want" > "$bin/.$name.stamp"
}

LDFLAGS="" build etcd etcd "$bin/etcd" go.etcd.io/etcd/server/v3
LDFLAGS=$k8s_ldflags build k8s kube "$bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
# helm, for the chart's tests (deploy/helm/kvnet); test-only.
LDFLAGS="" build helm helm "$bin/helm" helm.sh/helm/v3/cmd/helm
# kwok, for the scale lab (kvnet-lab scale, make scale).
LDFLAGS="" build kwok kwok "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok
echo "build-tools: binaries in $bin"
