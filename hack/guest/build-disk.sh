#!/usr/bin/env bash
# Builds the lab's guest (hack/guest/build.sh: Debian's cloud kernel and
# the busybox initramfs) as a bootable raw disk, the disk of the guest's
# KubeVirt containerDisk image (docs/kubevirt-images.md):
#
#   an MBR partition table (syslinux's mbr.bin as boot code) with one
#   active FAT partition at 1 MiB holding vmlinuz, initrd.gz, syslinux's
#   ldlinux.sys/ldlinux.c32 and syslinux.cfg, which boots the kernel with
#   "console=ttyS0 quiet panic=-1" (no kvnet.name=: the guest takes its
#   name from its first DHCP lease's hostname, see hack/guest/README.md).
#
# One sector after the partition pads the disk's CRC32 to >= 2^31 (see
# below). Made without mounting anything: sfdisk writes the table, mkfs.fat the
# file system at its offset, mtools copies the files in, syslinux --offset
# installs the boot loader (packages: hack/install-deps.sh --kubevirt).
#
# Usage: hack/guest/build-disk.sh [outdir]
#   (default ${KVNET_CACHE:-/var/cache/kvnet}/build/guest-disk)
# Writes <outdir>/image (build.sh's output, kernel .debs cached there) and
# <outdir>/disk.img; prints the path of disk.img as its only line on
# stdout. A stamp of the kernel, the initramfs, syslinux's version and this
# script makes a second run a no-op.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-${KVNET_CACHE:-/var/cache/kvnet}/build/guest-disk}
log() { echo "guest-disk: $*" >&2; }
die() { echo "guest-disk: error: $*" >&2; exit 1; }
need() {
  command -v "$1" >/dev/null 2>&1 ||
    die "$1 not found: install Debian package $2 (hack/install-deps.sh --kubevirt)"
}
need sfdisk fdisk
need mkfs.fat dosfstools
need mcopy mtools
need syslinux syslinux
mbr=/usr/lib/syslinux/mbr/mbr.bin
[ -f "$mbr" ] || die "$mbr not found: install Debian package syslinux-common"

mkdir -p "$out"
"$here/build.sh" "$out/image" >&2
exec 9>"$out/.lock"
flock 9

stamp=$({
  sha256sum <"$out/image/vmlinuz"
  sha256sum <"$out/image/initramfs.cpio.gz"
  syslinux --version 2>&1 | head -n1
  sha256sum <"$mbr"
  sha256sum <"${BASH_SOURCE[0]}"
} | sha256sum | cut -d' ' -f1)
if [ -f "$out/disk.stamp" ] && [ "$(cat "$out/disk.stamp")" = "$stamp" ] && [ -s "$out/disk.img" ]; then
  log "up to date: $out/disk.img"
  echo "$out/disk.img"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/syslinux.cfg" <<'EOF'
DEFAULT kvnet
PROMPT 0
TIMEOUT 0
LABEL kvnet
  KERNEL /vmlinuz
  INITRD /initrd.gz
  APPEND console=ttyS0 quiet panic=-1
EOF

# Size: the files plus 4 MiB of slack for the file system and syslinux,
# rounded up to whole MiB, plus the 1 MiB before the partition.
files_kib=$(du -k -c "$out/image/vmlinuz" "$out/image/initramfs.cpio.gz" | tail -n1 | cut -f1)
part_mib=$(((files_kib + 1023) / 1024 + 4))
disk="$work/disk.img"
truncate -s "$((part_mib + 1))M" "$disk"
# One active FAT16 (LBA) partition from sector 2048 to the end.
echo 'start=2048, type=e, bootable' | sfdisk -q --label dos "$disk"
part_sectors=$((part_mib * 2048))
mkfs.fat -F 16 -n KVNETGUEST --offset 2048 "$disk" $((part_sectors / 2)) >/dev/null
img="$disk@@1M"
mcopy -i "$img" "$out/image/vmlinuz" ::/vmlinuz
mcopy -i "$img" "$out/image/initramfs.cpio.gz" ::/initrd.gz
mcopy -i "$img" "$work/syslinux.cfg" ::/syslinux.cfg
syslinux --offset 1048576 --install "$disk"
# The MBR's boot code (its first 440 bytes), which chains to the active
# partition's boot sector.
dd if="$mbr" of="$disk" bs=440 count=1 conv=notrunc status=none

# The disk's CRC32 is made >= 2^31 on purpose. virt-handler reports a
# containerDisk's CRC32 (IEEE, of the whole file) in the VMI's
# status.volumeStatus[].containerDiskVolume.checksum, a uint32 that
# KubeVirt before v1.8.4 declares as format int32, and Kubernetes 1.36
# validates that format: a VMI whose disk's CRC32 is >= 2^31 is rejected
# and hangs in Scheduled (kubevirt/kubevirt#17858). So that this can never
# depend on the bytes of a kernel again, one 512-byte sector appended
# after the partition's end (nothing reads it) carries a counter, raised
# until the CRC32 is >= 2^31 (each try succeeds one time in two).
# gzip's trailer holds the input's CRC32 (IEEE, little-endian).
crc32() { gzip -1 -c "$1" | tail -c8 | od -An -tu4 -N4 | tr -d ' '; }
size=$(stat -c %s "$disk")
for n in $(seq 0 63); do
  truncate -s "$size" "$disk"
  { printf 'kvnet-crc32-pad %08d\n' "$n"; head -c 487 /dev/zero; } >>"$disk"
  crc=$(crc32 "$disk")
  [ "$crc" -lt 2147483648 ] || break
done
[ "$crc" -ge 2147483648 ] || die "no pad of 64 gave a CRC32 >= 2^31"
log "CRC32 $crc (>= 2^31 on purpose, pad $n)"

rm -f "$out/disk.stamp"
mv "$disk" "$out/disk.img"
echo "$stamp" >"$out/disk.stamp"
log "built $out/disk.img ($((part_mib + 1)) MiB)"
echo "$out/disk.img"
