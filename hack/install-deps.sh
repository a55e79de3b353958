#!/usr/bin/env bash
# Installs the system packages kvnet's tests and lab use, when missing:
# iproute2 and nftables for the datapath, busybox for its udhcpc DHCP client
# and the applets tests use (ping, nslookup, wget: no iputils-ping needed),
# util-linux for nsenter and setpriv, dhcpcd-base for dhcpcd and
# isc-dhcp-client for ISC dhclient (the two DHCPv6 clients the DHCPv6
# server is tested with),
# qemu-system-x86 for the lab's QEMU guests (internal/lab/guest; their image
# is built from Debian packages by hack/guest/build.sh), syslinux,
# syslinux-common, mtools, dosfstools and fdisk for the guest's bootable
# disk (hack/guest/build-disk.sh, booted by internal/lab/guest's tests).
# Go modules come from the module proxy; control-plane binaries are built by
# hack/build-tools.sh (make tools).
#
# hack/install-deps.sh --cluster: the packages of the real cluster
# (internal/lab/cluster, docs/cluster.md) instead: containerd and runc (each
# node runs Debian's), iptables (the kubelet's and the CNI plugins'
# helpers), nftables (kube-proxy's nftables mode runs nft), util-linux
# (nsenter, unshare), dpkg (to unpack busybox-static for the workload
# image).
#
# hack/install-deps.sh --kubevirt: the packages KubeVirt's images are built
# with (hack/build-kubevirt.sh, docs/kubevirt-images.md): gcc and
# libvirt-dev (virt-launcher and virt-handler link libvirt with cgo; the C
# helpers are compiled from KubeVirt's source), debootstrap (virt-launcher's
# libvirt + QEMU root filesystem), syslinux, syslinux-common, mtools,
# dosfstools and fdisk (the guest's bootable containerDisk). libvirtd,
# virtlogd and QEMU for virt-launcher are not host tools: they are
# installed into the image's root file system (libvirt-daemon & co. in
# hack/build-kubevirt-rootfs.sh, which checks them there), and the
# image's virtqemud is kvnet's stand-in script in front of that
# libvirtd (internal/lab/kvimages); nothing runs either on the host.
set -euo pipefail
need=()
if [ "${1:-}" = --kubevirt ]; then
  command -v gcc >/dev/null || need+=(gcc)
  [ -f /usr/include/libvirt/libvirt.h ] || need+=(libvirt-dev)
  command -v pkg-config >/dev/null || need+=(pkg-config)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v syslinux >/dev/null || need+=(syslinux)
  [ -f /usr/lib/syslinux/mbr/mbr.bin ] || need+=(syslinux-common)
  command -v mcopy >/dev/null || need+=(mtools)
  command -v mkfs.fat >/dev/null || need+=(dosfstools)
  command -v sfdisk >/dev/null || need+=(fdisk)
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "install-deps: building KubeVirt's images needs root; missing ${need[*]}" >&2; exit 1; }
    command -v apt-get >/dev/null || { echo "install-deps: missing ${need[*]} (Debian package names) and no apt-get" >&2; exit 1; }
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
  fi
  exit 0
fi
if [ "${1:-}" = --cluster ]; then
  command -v ip >/dev/null || need+=(iproute2)
  { command -v nsenter >/dev/null && command -v unshare >/dev/null && command -v setpriv >/dev/null; } || need+=(util-linux)
  command -v containerd >/dev/null || need+=(containerd)
  command -v runc >/dev/null || need+=(runc)
  command -v iptables >/dev/null || need+=(iptables)
  command -v nft >/dev/null || need+=(nftables)
  command -v dpkg-deb >/dev/null || need+=(dpkg)
  command -v sysctl >/dev/null || need+=(procps)
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "install-deps: the cluster needs root; missing ${need[*]}" >&2; exit 1; }
    command -v apt-get >/dev/null || { echo "install-deps: missing ${need[*]} (Debian package names) and no apt-get" >&2; exit 1; }
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
  fi
  # The cluster runs containerd itself, per node: the package's own
  # service (where an init started it) is not used.
  exit 0
fi
command -v ip >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
command -v busybox >/dev/null || need+=(busybox)
command -v dhcpcd >/dev/null || need+=(dhcpcd-base)
command -v dhclient >/dev/null || need+=(isc-dhcp-client)
command -v make >/dev/null || need+=(make)
# util-linux: nsenter (tests enter pod namespaces with it) and setpriv (the
# control plane starts etcd and kube-apiserver under a parent-death signal).
{ command -v nsenter >/dev/null && command -v setpriv >/dev/null; } || need+=(util-linux)
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
# The guest's bootable containerDisk (hack/guest/build-disk.sh), which
# internal/lab/guest's TestDiskBootsNamedByDHCP boots: a partition table,
# a FAT file system written without mounting, syslinux and its MBR.
command -v sfdisk >/dev/null || need+=(fdisk)
command -v mkfs.fat >/dev/null || need+=(dosfstools)
command -v mcopy >/dev/null || need+=(mtools)
command -v syslinux >/dev/null || need+=(syslinux)
[ -f /usr/lib/syslinux/mbr/mbr.bin ] || need+=(syslinux-common)
# skopeo: the images test checks that an independent OCI tool reads what
# make images writes.
command -v skopeo >/dev/null || need+=(skopeo)
if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    # Not Debian or Ubuntu: name what is missing, in Debian's package
    # names, and stop before anything fails for want of it.
    echo "install-deps: missing ${need[*]} (Debian package names), and this host has no apt-get: install them with its package manager" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null; then
      # Without root the lab has no nodes and the privileged tests do not
      # run, so these are not needed; say what is missing and go on.
      echo "install-deps: not root and no sudo: not installing ${need[*]} (the lab's nodes and the privileged tests need root and them)" >&2
      exit 0
    fi
    sudo=sudo
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}"
fi
# promtool: make test unit-tests kvnet's alert rules (config/monitoring).
# Debian ships it in its prometheus package; without its recommends (the
# node exporter), nothing else comes with it.
if ! command -v promtool >/dev/null && command -v apt-get >/dev/null; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  if [ -z "$sudo" ] || command -v sudo >/dev/null; then
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends prometheus
  else
    echo "install-deps: not root and no sudo: not installing prometheus (promtool; the alert rules' test skips without it)" >&2
  fi
fi
# The tests' probes and the lab's guests and workload image run busybox's
# applets (ping, nc, httpd, nslookup, udhcpc), never host tools of those
# names: check that this busybox has them.
if command -v busybox >/dev/null; then
  # The list is read whole (no grep -q): grep leaving early would kill
  # busybox with SIGPIPE, and pipefail would fail the check at random.
  applets=$(busybox --list)
  for applet in nc ping httpd nslookup udhcpc; do
    grep -qx "$applet" <<<"$applets" || { echo "install-deps: busybox has no $applet applet (the lab's probes and guests use busybox $applet): install Debian's busybox" >&2; exit 1; }
  done
fi
