//go:build tools

// Package tools records the registry command built by
// hack/build-cluster-tools.sh.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
