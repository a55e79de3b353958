package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Image is a guest's kernel and initramfs, as hack/guest/build.sh writes
// them.
type Image struct {
	Kernel string // path of vmlinuz
	Initrd string // path of initramfs.cpio.gz
}

// ErrImageNotBuilt is what FindImage returns (wrapped, with the missing
// file) when the image is not there.
var ErrImageNotBuilt = errors.New("guest image not built: run hack/guest/build.sh")

// QEMUBinary is the QEMU that runs the guests, and QEMUPackage the Debian
// package that has it.
const (
	QEMUBinary  = "qemu-system-x86_64"
	QEMUPackage = "qemu-system-x86"
)

// ErrQEMUNotFound is what CheckQEMU returns when QEMUBinary is not in PATH.
var ErrQEMUNotFound = fmt.Errorf("%s not found: install Debian package %s", QEMUBinary, QEMUPackage)

// BuildScript is the script that builds the image, relative to the
// repository root.
const BuildScript = "hack/guest/build.sh"

// DefaultImageDir is where hack/guest/build.sh writes the image when given
// no directory: .cache/guest under the repository root.
func DefaultImageDir(repoRoot string) string {
	return filepath.Join(repoRoot, ".cache", "guest")
}

// FindImage returns the image in dir, or an error wrapping
// ErrImageNotBuilt when its kernel or initramfs is missing or empty.
func FindImage(dir string) (Image, error) {
	img := Image{
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initramfs.cpio.gz"),
	}
	for _, p := range []string{img.Kernel, img.Initrd} {
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
			return Image{}, fmt.Errorf("%w (no %s)", ErrImageNotBuilt, p)
		}
	}
	return img, nil
}

// EnsureImage runs hack/guest/build.sh of the repository at repoRoot (a
// no-op when the image is up to date; otherwise it downloads Debian
// packages, which may take a minute) and returns the image in
// DefaultImageDir(repoRoot).
func EnsureImage(repoRoot string) (Image, error) {
	return EnsureImageContext(context.Background(), repoRoot)
}

// EnsureImageContext is EnsureImage, ending the build when ctx ends.
func EnsureImageContext(ctx context.Context, repoRoot string) (Image, error) {
	script := filepath.Join(repoRoot, BuildScript)
	if _, err := os.Stat(script); err != nil {
		return Image{}, fmt.Errorf("guest image: %w", err)
	}
	dir := DefaultImageDir(repoRoot)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script, dir)
	cmd.Dir = repoRoot
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return Image{}, fmt.Errorf("%s: %w: %s", BuildScript, err, strings.TrimSpace(out.String()))
	}
	return FindImage(dir)
}

// CheckQEMU reports whether QEMUBinary is in PATH: ErrQEMUNotFound, which
// names the Debian package to install, when it is not.
func CheckQEMU() error {
	if _, err := exec.LookPath(QEMUBinary); err != nil {
		return ErrQEMUNotFound
	}
	return nil
}
