// Package repo finds the kvnet source tree a test or the lab runs from.
package repo

import (
	"context"
	"errors"
	"os"
	"os/exec"
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

// GoBuild returns the command that compiles kvnet's binaries in the
// repository at root: goBin build -trimpath ARGS with cgo off. The images
// (internal/images), the lab's image binaries and the tests' binaries all
// build this way: static, and, with one setting for all, compiled once in
// the Go build cache (cgo and -trimpath change every package's cache key).
func GoBuild(ctx context.Context, goBin, root string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, goBin, append([]string{"build", "-trimpath"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}
