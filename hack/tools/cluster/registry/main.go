// Command registry is the real-cluster lab's image registry: distribution
// (github.com/distribution/distribution/v3, the version go.mod pins) with
// only the filesystem storage driver, which the lab's registry
// configuration uses (internal/lab/cluster, startRegistry), and no auth
// or proxy plugins. distribution's own cmd/registry links the Azure, GCS
// and S3 drivers too; hack/build-cluster-tools.sh builds this package
// instead.
//
// A storage driver registers itself in its package's init; a
// configuration naming one that is not linked stops the registry at
// start ("StorageDriver not registered: s3").
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	// cobra has printed the error already.
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
