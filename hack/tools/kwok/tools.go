//go:build tools

// Package kwok records the kwok command built by hack/build-tools.sh.
package kwok

import _ "sigs.k8s.io/kwok/cmd/kwok"
