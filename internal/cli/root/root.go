// Package root assembles the kvnet command line (the operator's tool;
// the lab is kvnet-lab).
package root

import (
	"github.com/spf13/cobra"

	"kvnet.io/kvnet/internal/cli/audit"
	"kvnet.io/kvnet/internal/cli/get"
	"kvnet.io/kvnet/internal/cli/install"
	"kvnet.io/kvnet/internal/cli/why"
)

// NewCommand returns the kvnet root command.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "kvnet",
		Short:         "kvnet: VM networking for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	cmd.AddCommand(get.NewCommand(), audit.NewCommand(), why.NewCommand(),
		install.NewCommand(), install.NewUninstallCommand(), install.NewCheckCommand())
	return cmd
}
