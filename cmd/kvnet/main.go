// Command kvnet is kvnet's operator command line: install, check,
// uninstall, get, why and audit against a cluster. The lab, the demo and
// chaos are in kvnet-lab.
package main

import (
	"context"
	"os"

	"kvnet.io/kvnet/internal/cli/root"
)

func main() {
	if err := root.NewCommand().ExecuteContext(context.Background()); err != nil {
		os.Exit(1)
	}
}
