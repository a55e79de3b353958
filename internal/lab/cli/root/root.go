// Package root assembles kvnet-lab, the lab's command line: a whole kvnet
// installation on one machine (up, down, console), the demo and chaos.
// It is a developer's and evaluator's tool, apart from the operator's kvnet
// command, as kind stands apart from kubectl; no shipped binary links it.
package root

import (
	"github.com/spf13/cobra"

	"kvnet.io/kvnet/internal/lab/cli/cluster"
	"kvnet.io/kvnet/internal/lab/cli/demo"
	"kvnet.io/kvnet/internal/lab/cli/lab"
)

// NewCommand returns the kvnet-lab root command.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:          "kvnet-lab",
		Short:        "kvnet-lab: kvnet and a real control plane on this machine, its demo and chaos",
		SilenceUsage: true,
	}
	cmd.AddCommand(lab.NewCommands()...)
	cmd.AddCommand(demo.NewCommand(), lab.NewChaosCommand(), lab.NewScaleCommand(), cluster.NewCommand())
	return cmd
}
