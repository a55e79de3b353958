#!/usr/bin/env bash
# Fails when generated files are stale, Go code is unformatted or a commit
# subject is over 72 characters (hack/check-subjects.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed: $unformatted"; exit 1; fi
go vet ./...
hack/check-subjects.sh
hack/update-codegen.sh
if [ -n "$(git status --porcelain -- config/crd deploy/helm "api/*/*/zz_generated.deepcopy.go")" ]; then
  git status --porcelain -- config/crd deploy/helm "api/*/*/zz_generated.deepcopy.go"
  echo "generated files are stale: run make generate"; exit 1
fi
