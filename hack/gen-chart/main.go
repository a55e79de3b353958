// Command gen-chart writes the files of kvnet's Helm chart that are
// generated from config/ (install.ChartFiles) into deploy/helm/kvnet,
// removing generated files config/ no longer has. Run by make generate.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"kvnet.io/kvnet/internal/install"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gen-chart:", err)
		os.Exit(1)
	}
}

func run() error {
	files, err := install.ChartFiles()
	if err != nil {
		return err
	}
	// crds/ holds generated files only.
	old, err := filepath.Glob(filepath.Join(install.ChartDir, "crds", "*.yaml"))
	if err != nil {
		return err
	}
	for _, p := range old {
		rel := strings.TrimPrefix(filepath.ToSlash(p), install.ChartDir+"/")
		if _, ok := files[rel]; !ok {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	for rel, b := range files {
		p := filepath.Join(install.ChartDir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
