// Command kvnet is kvnet's command line: the local lab and the demo. Run
// as kvnet-cni or kvnet-ipam (the lab links it so into its CNI bin dir),
// it is the CNI plugin.
package main

import (
	"context"
	"os"
	"path/filepath"

	"kvnet.io/kvnet/internal/cli/root"
	"kvnet.io/kvnet/internal/k8s/podsource"
	"kvnet.io/kvnet/internal/netconf"
)

func main() {
	switch filepath.Base(os.Args[0]) {
	case netconf.PluginType, netconf.IPAMType:
		podsource.PluginMain()
		return
	}
	if err := root.NewCommand().ExecuteContext(context.Background()); err != nil {
		os.Exit(1)
	}
}
