#!/usr/bin/env bash
# Builds the Debian root file system under virt-launcher and virt-handler
# in the real cluster's KubeVirt images (docs/kubevirt-images.md), as a
# tar file of one image layer:
#
#   debootstrap --variant=minbase <suite>, then apt-get install
#   --no-install-recommends of the packages below in the chroot, a "qemu"
#   user and group with uid/gid 107 (KubeVirt runs QEMU, and a non-root
#   virt-launcher, as 107), apt's lists and caches, documentation and
#   locales removed.
#
# Suite: trixie (Debian 13: libvirt 11.3, QEMU 10.0), not bookworm
# (libvirt 9.0, QEMU 7.2), because KubeVirt v1.8 expects a libvirt of its
# own generation (its images carry libvirt 11); virt-launcher is linked
# against bookworm's libvirt-dev 9.0 and runs on trixie's newer libvirt0
# and glibc (both keep their old symbols). Neither suite ships libvirt's
# modular daemons (virtqemud): the image assembly (internal/lab/kvimages)
# puts a virtqemud in front of libvirtd.
#
# Packages (KubeVirt's launcher and handler bases, in Debian's names):
#   libvirt-daemon           libvirtd with the QEMU driver
#   libvirt-daemon-driver-qemu, libvirt-daemon-log (virtlogd)
#   libvirt-clients          virsh (virt-handler's node labeller runs it in
#                            the virt-launcher image)
#   qemu-system-x86          QEMU, SeaBIOS, iPXE
#   qemu-utils               qemu-img (disk images, virt-handler too)
#   iproute2, nftables       virt-launcher's and virt-handler's networking
#   procps, xorriso          ps; cloud-init ISOs (virt-launcher)
#
# Cached OUTSIDE the clone: ${KVNET_CACHE:-/var/cache/kvnet}/build/
# kubevirt-rootfs-<suite>-<stamp>/rootfs.tar, where <stamp> hashes this
# script (suite and packages included); the downloaded .deb files stay in
# $KVNET_CACHE/build/debs-<suite>/ for the next build. Prints the tar's path as its only
# line on stdout. Needs root (debootstrap, chroot) and network access to
# the Debian archive; packages: hack/install-deps.sh --kubevirt.
set -euo pipefail
suite=trixie
mirror=${KVNET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-log libvirt-clients qemu-system-x86 qemu-utils
  iproute2 nftables procps xorriso)
cache=${KVNET_CACHE:-/var/cache/kvnet}
log() { echo "build-kubevirt-rootfs: $*" >&2; }
die() { echo "build-kubevirt-rootfs: error: $*" >&2; exit 1; }

stamp=$(sha256sum <"${BASH_SOURCE[0]}" | cut -c1-16)
out="$cache/build/kubevirt-rootfs-$suite-$stamp"
if [ -f "$out/.done" ]; then
  log "up to date: $out/rootfs.tar"
  echo "$out/rootfs.tar"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap not found: run hack/install-deps.sh --kubevirt"
mkdir -p "$cache/build"
exec 9>"$cache/.build-kubevirt-rootfs.lock"
flock 9
if [ -f "$out/.done" ]; then
  echo "$out/rootfs.tar"
  exit 0
fi

start=$SECONDS
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
root="$out.tmp/root"
debs="$cache/build/debs-$suite"
mkdir -p "$debs/partial"
cleanup() {
  umount "$root/var/cache/apt/archives" 2>/dev/null || true
  umount "$root/proc" 2>/dev/null || true
  rm -rf "$out.tmp"
}
trap cleanup EXIT
log "debootstrap $suite into $root (minutes: it downloads the base system)"
debootstrap --variant=minbase --cache-dir="$debs" "$suite" "$root" "$mirror" >&2
# No service starts in the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"
mount -t proc proc "$root/proc"
mount --bind "$debs" "$root/var/cache/apt/archives"
log "apt-get install ${packages[*]}"
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  -o APT::Sandbox::User=root "${packages[@]}" >&2
umount "$root/var/cache/apt/archives"
chroot "$root" groupadd --system --gid 107 qemu
chroot "$root" useradd --system --uid 107 --gid 107 --home-dir /home/qemu --create-home --shell /bin/bash qemu
umount "$root/proc"
# The daemons the image runs live in this root file system, not on the
# host: libvirtd (which the image's virtqemud stand-in starts), virtlogd,
# QEMU and virsh. A package that installed without them stops here.
for bin in /usr/sbin/libvirtd /usr/sbin/virtlogd /usr/bin/qemu-system-x86_64 /usr/bin/virsh; do
  [ -x "$root$bin" ] || die "$bin missing from the $suite root file system after apt-get install ${packages[*]}"
done
# Versions, for the docs and the image's labels.
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' "${packages[@]}" libvirt0 >"$out.tmp/versions"
rm -f "$root/usr/sbin/policy-rc.d"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/info "$root"/usr/share/locale \
  "$root"/var/log/*.log "$root"/var/log/apt "$root"/tmp/* "$root"/dev/*
# /var/run as a relative link, as in KubeVirt's own images: virt-handler
# reaches a launcher's sockets through /proc/<pid>/root/var/run/kubevirt,
# and an absolute link (debootstrap's /var/run -> /run) would resolve
# against virt-handler's root instead, so its migration proxy's sockets
# would land outside the launcher ("Failed to connect socket to
# /var/run/kubevirt/migrationproxy/...-source.sock").
ln -sfn ../run "$root/var/run"
log "tar $(du -sh "$root" | cut -f1)"
tar --numeric-owner --xattrs --xattrs-include='security.capability' -C "$root" -cf "$out.tmp/rootfs.tar" .
rm -rf "$root"
touch "$out.tmp/.done"
trap - EXIT
rm -rf "$out"
mv "$out.tmp" "$out"
log "built $out/rootfs.tar in $((SECONDS - start))s"
echo "$out/rootfs.tar"
