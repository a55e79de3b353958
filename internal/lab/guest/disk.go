package guest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DiskScript builds the guest as a bootable raw disk (the disk of its
// KubeVirt containerDisk image), relative to the repository root.
const DiskScript = "hack/guest/build-disk.sh"

// DefaultDiskDir is where EnsureDisk builds the disk: outside the clone, in
// the build cache the real cluster's tools share (${KVNET_CACHE:-/var/cache/kvnet}),
// so that fresh clones on the same machine reuse it.
func DefaultDiskDir() string {
	cache := os.Getenv("KVNET_CACHE")
	if cache == "" {
		cache = "/var/cache/kvnet"
	}
	return filepath.Join(cache, "build", "guest-disk")
}

// EnsureDisk runs hack/guest/build-disk.sh of the repository at repoRoot
// into dir (DefaultDiskDir when ""; a no-op when the disk is up to date)
// and returns the path of the disk: an MBR disk with one FAT partition on
// which syslinux boots the guest's kernel and initramfs with a fixed
// command line (the guest then takes its name from DHCP; see Config.Disk).
// It needs the packages of hack/install-deps.sh --kubevirt.
func EnsureDisk(ctx context.Context, repoRoot, dir string) (string, error) {
	script := filepath.Join(repoRoot, DiskScript)
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("guest disk: %w", err)
	}
	if dir == "" {
		dir = DefaultDiskDir()
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script, dir)
	cmd.Dir = repoRoot
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w: %s", DiskScript, err, strings.TrimSpace(stderr.String()))
	}
	disk := strings.TrimSpace(stdout.String())
	st, err := os.Stat(disk)
	if err != nil {
		return "", fmt.Errorf("%s printed %q: %w", DiskScript, disk, err)
	}
	if !st.Mode().IsRegular() || st.Size() == 0 {
		return "", fmt.Errorf("%s printed %q, which is not a non-empty file", DiskScript, disk)
	}
	return disk, nil
}
