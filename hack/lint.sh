#!/usr/bin/env bash
# Runs golangci-lint (with the import boundaries of .golangci.yml),
# installing the pinned version into .cache/bin first when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
version=v2.15.0
bin=$PWD/.cache/bin/golangci-lint
if ! [ -x "$bin" ] || ! grep -q "version ${version#v} " <<<"$("$bin" --version 2>/dev/null)"; then
  echo "installing golangci-lint $version into .cache/bin (a few minutes, once)"
  GOBIN=$PWD/.cache/bin go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version"
fi
exec "$bin" run "$@" ./...
