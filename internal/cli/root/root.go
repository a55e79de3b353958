// Package root assembles the kvnet command line.
package root

import (
	"github.com/spf13/cobra"

	"kvnet.io/kvnet/internal/cli/audit"
	"kvnet.io/kvnet/internal/cli/demo"
	"kvnet.io/kvnet/internal/cli/get"
	"kvnet.io/kvnet/internal/cli/install"
	"kvnet.io/kvnet/internal/cli/lab"
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
	cmd.AddCommand(lab.NewCommand(), lab.NewChaosCommand(), demo.NewCommand(), get.NewCommand(), audit.NewCommand(), why.NewCommand(),
		install.NewCommand(), install.NewUninstallCommand(), install.NewCheckCommand())
	return cmd
}
