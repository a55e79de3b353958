// Command kvnet-lab runs kvnet's lab on this machine: a real control plane
// with kvnet-controller and simulated nodes (up, down, console), the demo
// and chaos. Cluster operators use the kvnet command instead.
package main

import (
	"context"
	"os"

	"kvnet.io/kvnet/internal/lab/cli/root"
)

func main() {
	if err := root.NewCommand().ExecuteContext(context.Background()); err != nil {
		os.Exit(1)
	}
}
