// Command kvnet is kvnet's command line: the local lab and the demo.
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
