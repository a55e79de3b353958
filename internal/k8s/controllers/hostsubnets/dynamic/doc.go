// Package dynamic holds the tests of kvnet-controller's dynamic host
// subnets (--enable-dynamic-host-subnets) against a real API server: a
// package of its own, as the controller of package hostsubnets' tests
// gives every node every network.
package dynamic
