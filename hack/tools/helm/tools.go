//go:build tools

// Package helm records the helm command built by hack/build-tools.sh.
package helm

import _ "helm.sh/helm/v3/cmd/helm"
