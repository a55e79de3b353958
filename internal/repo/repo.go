// Package repo finds the kvnet source tree a test or the lab runs from.
package repo

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// Root returns the kvnet repository root: the nearest directory at or
// above the working directory whose go.mod declares module kvnet.io/kvnet.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module kvnet.io/kvnet\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kvnet repository root not found above the working directory")
		}
		dir = parent
	}
}
