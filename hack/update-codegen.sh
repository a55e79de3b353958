#!/usr/bin/env bash
# Regenerates deepcopy code and CRDs from the Go types in api/ (with the
# controller-gen version pinned in go.mod: go tool) and the Helm chart's
# files generated from config/ (hack/gen-chart: deploy/helm/kvnet).
set -euo pipefail
cd "$(dirname "$0")/.."
go tool controller-gen object:headerFile=hack/boilerplate.go.txt paths=./api/...
go tool controller-gen paths=./api/... crd:generateEmbeddedObjectMeta=true output:crd:dir=config/crd/bases
# The Helm chart's files generated from config/ (deploy/helm/kvnet).
go run ./hack/gen-chart
