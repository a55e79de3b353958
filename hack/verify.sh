#!/usr/bin/env bash
# Fails when generated files are stale, Go code is unformatted or a commit
# subject is over 72 characters (hack/check-subjects.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted"; exit 1; fi
# In the build configuration of every go build the tests and images run
# (internal/repo.GoBuild: static, -trimpath): the packages vet compiles
# are then in the build cache for them, instead of compiled twice.
CGO_ENABLED=0 go vet -trimpath ./...
hack/check-subjects.sh
hack/update-codegen.sh
if [ -n "$(git status --porcelain -- config/crd deploy/helm "api/*/*/zz_generated.deepcopy.go")" ]; then
  git status --porcelain -- config/crd deploy/helm "api/*/*/zz_generated.deepcopy.go"
  echo "generated files are stale: run make generate"; exit 1
fi
