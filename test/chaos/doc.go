// Package chaos runs kvnet's lab under faults and at scale, as make chaos
// and make scale do at a size CI affords: the chaos run (operations while
// kvnet-controller, the API server and kvnet-node are killed) and the
// scale lab (KWOK nodes, many pods and VMs, churn and a restart). It is a
// package of its own, apart from test/e2e, so that go test runs it beside
// the end-to-end lab tests, whose labs wait on guests more than they
// compute (the two cores of a CI-like run were 59% busy while test/e2e
// ran alone, the chaos and scale runs in it).
package chaos
