//go:build tools

// Package etcd records the etcd command built by hack/build-tools.sh.
package etcd

import _ "go.etcd.io/etcd/server/v3"
