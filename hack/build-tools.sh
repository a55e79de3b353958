#!/usr/bin/env bash
# Builds the control-plane binaries kvnet's tests and lab run (etcd,
# kube-apiserver, kube-controller-manager) from their Go modules, pinned in
# hack/tools/{etcd,k8s}/go.mod, into .cache/bin. A stamp of the pinned
# versions makes the next run a no-op until a pin changes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVNET_BIN_DIR:-$root/.cache/bin}
mkdir -p "$bin"

stamp_of() { sha256sum "$root/hack/tools/$1/go.mod" "$root/hack/tools/$1/go.sum" | sha256sum | cut -c1-16; }

build() { # build <module dir> <stamp name> <-o target> <packages...>
  local dir=$1 name=$2 out=$3; shift 3
  local want; want=$(stamp_of "$dir")
  if [ -f "$bin/.$name.stamp" ] && [ "$(cat "$bin/.$name.stamp")" = "$want" ]; then
    echo "build-tools: $name up to date"
    return
  fi
  echo "build-tools: building $name (first run takes several minutes)"
  (cd "$root/hack/tools/$dir" && go build -trimpath -o "$out" "$@")
  echo "$want" > "$bin/.$name.stamp"
}

build etcd etcd "$bin/etcd" go.etcd.io/etcd/server/v3
build k8s kube "$bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
echo "build-tools: binaries in $bin"
