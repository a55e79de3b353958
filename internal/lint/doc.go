// Package lint holds repository-wide checks (see lint_test.go): every
// package has a package doc, and core packages import no Kubernetes client.
package lint
