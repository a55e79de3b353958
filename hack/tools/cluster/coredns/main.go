// Command coredns is the real-cluster lab's cluster DNS: CoreDNS
// (github.com/coredns/coredns, the version go.mod pins) with only the
// plugins the lab's Corefile uses (internal/lab/cluster/manifests/
// coredns.yaml) plus forward, hosts and log, the ones a user adds first.
// CoreDNS's own main links all of its plugins, cloud backends included;
// a cold build of it took about 20 minutes on a loaded 2-core machine.
// hack/build-cluster-tools.sh builds this package.
//
// A plugin registers itself (with the Caddy server type CoreDNS uses) in
// its package's init, and core/dnsserver's directive list fixes the order
// plugins run in, so linking a package is all that adding a plugin takes.
// `coredns -plugins` lists what is linked.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The lab Corefile's plugins.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics" // "prometheus"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	// Common additions to a cluster's Corefile.
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/log"
)

func main() { coremain.Run() }
