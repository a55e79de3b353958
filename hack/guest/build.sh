#!/usr/bin/env bash
# Builds the kvnet lab guest image from Debian packages: a kernel
# (Debian's cloud kernel, the one linux-image-cloud-amd64 points at) and a
# busybox initramfs whose /init (hack/guest/rootfs) loads the virtio drivers,
# runs DHCP on every NIC (busybox udhcpc; dhcpcd, with glibc, for router
# advertisements and DHCPv6) and serves TCP echo (7), HTTP (80) and, lab
# only, a one-line exec service (2323). See hack/guest/README.md.
#
# Usage: hack/guest/build.sh [outdir]     (default: <repo>/.cache/guest)
# Writes <outdir>/vmlinuz and <outdir>/initramfs.cpio.gz. Cached: a stamp of
# the package versions and of this script and rootfs/ skips the work when
# nothing changed; downloaded .deb files are kept in <outdir>/debs.
#
# Environment: KVNET_GUEST_KERNEL_META, the meta package naming the kernel
# (default linux-image-cloud-amd64; e.g. linux-image-6.12-cloud-amd64).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/.cache/guest}
meta=${KVNET_GUEST_KERNEL_META:-linux-image-cloud-amd64}
# The drivers the guest needs; build.sh adds their dependencies from
# modules.dep and orders them so each loads after what it needs.
want_modules=(virtio_pci virtio_net)

mkdir -p "$out"
# One build at a time per output directory: the lab and test packages
# running in parallel may all ask for the image.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$out/.lock"
  flock 9
fi

log() { echo "guest: $*" >&2; }
die() { echo "guest: error: $*" >&2; exit 1; }

# need TOOL PACKAGE: fail naming the tool and the Debian package with it.
need() {
  command -v "$1" >/dev/null 2>&1 ||
    die "$1 not found: install Debian package $2 (apt-get install $2)"
}
need apt-get apt
need apt-cache apt
need dpkg-deb dpkg
need gzip gzip
need sha256sum coreutils
need find findutils
need awk mawk

# kernel_package: the linux-image-* package $meta depends on, "" if unknown.
kernel_package() {
  apt-cache depends --important "$meta" 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-.*-amd64$/ { print $2; exit }'
}
# candidates PKG...: "PKG VERSION" per package apt can install.
candidates() {
  apt-cache policy "$@" 2>/dev/null |
    awk '/^[^ ]/ { p = $1; sub(/:$/, "", p) } $1 == "Candidate:" && $2 != "(none)" { print p, $2 }'
}

# The userland beside busybox: Debian's busybox has no DHCPv6 client
# (udhcpc6), so dhcpcd (dhcpcd-base) does IPv6, with glibc (libc6), the
# only library it links.
userland=(busybox-static dhcpcd-base libc6)

# Package lists: apt-get update once if they do not know our packages.
kpkg=$(kernel_package)
if [ -z "$kpkg" ] || [ "$(candidates "${userland[@]}" | wc -l)" != "${#userland[@]}" ]; then
  if [ "$(id -u)" = 0 ]; then
    log "apt-get update (the package lists do not know $meta or one of ${userland[*]})"
    apt-get update -q >&2
  else
    die "the package lists do not know $meta or one of ${userland[*]}: run 'sudo apt-get update'"
  fi
  kpkg=$(kernel_package)
fi
[ -n "$kpkg" ] || die "cannot tell which kernel package $meta depends on (apt-cache depends $meta)"
versions=$(candidates "$kpkg" "${userland[@]}")
# version PKG: the candidate version of PKG (from $versions).
version() {
  local v
  v=$(awk -v p="$1" '$1 == p { print $2 }' <<<"$versions")
  [ -n "$v" ] || die "no installable version of $1"
  echo "$v"
}
kver=$(version "$kpkg")
bver=$(version busybox-static)
dver=$(version dhcpcd-base)
lver=$(version libc6)

stamp=$({
  echo "$kpkg=$kver"
  echo "busybox-static=$bver"
  echo "dhcpcd-base=$dver"
  echo "libc6=$lver"
  sha256sum <"${BASH_SOURCE[0]}"
  (cd "$here/rootfs" && find . -type f | LC_ALL=C sort | xargs sha256sum)
} | sha256sum | cut -d' ' -f1)
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] &&
  [ -s "$out/vmlinuz" ] && [ -s "$out/initramfs.cpio.gz" ]; then
  log "up to date: $out ($kpkg $kver, busybox-static $bver, dhcpcd-base $dver)"
  exit 0
fi

mkdir -p "$out/debs"
work=$(mktemp -d)
chmod 0755 "$work" # apt-get download writes as its sandbox user _apt
trap 'rm -rf "$work"' EXIT

# fetch PKG VERSION: the .deb in $out/debs (downloaded when missing).
fetch() {
  local deb
  deb=$(find "$out/debs" -maxdepth 1 -name "${1}_*.deb" | while read -r f; do
    [ "$(dpkg-deb -f "$f" Version)" = "$2" ] && echo "$f"
  done | head -n1)
  if [ -z "$deb" ]; then
    log "apt-get download $1=$2"
    # apt downloads as its sandbox user _apt when it can write the folder.
    local dl="$work/dl-$1"
    mkdir -p "$dl"
    if [ "$(id -u)" = 0 ] && id _apt >/dev/null 2>&1; then chown _apt "$dl"; fi
    (cd "$dl" && apt-get download -q "$1=$2" >&2)
    find "$out/debs" -maxdepth 1 -name "${1}_*.deb" -delete
    deb="$out/debs/$(basename "$(ls "$dl"/*.deb)")"
    mv "$dl"/*.deb "$deb"
  fi
  echo "$deb"
}
kdeb=$(fetch "$kpkg" "$kver")
bdeb=$(fetch busybox-static "$bver")
ddeb=$(fetch dhcpcd-base "$dver")
ldeb=$(fetch libc6 "$lver")

log "extracting $(basename "$kdeb"), $(basename "$bdeb"), $(basename "$ddeb") and $(basename "$ldeb")"
dpkg-deb -x "$kdeb" "$work/kernel"
dpkg-deb -x "$bdeb" "$work/busybox"
dpkg-deb -x "$ddeb" "$work/dhcpcd"
dpkg-deb -x "$ldeb" "$work/libc"
bb="$work/busybox/bin/busybox"
[ -x "$bb" ] || die "busybox-static has no bin/busybox"
# grep reads the whole list: with -q it would exit at the match, and
# busybox, still writing, would die of SIGPIPE and fail the pipe (pipefail).
"$bb" --list | grep -x cpio >/dev/null || die "busybox-static's busybox has no cpio applet"

vmlinuz=$(find "$work/kernel/boot" -name 'vmlinuz-*' | head -n1)
[ -n "$vmlinuz" ] || die "$kpkg has no /boot/vmlinuz-*"
uname_r=${vmlinuz##*/vmlinuz-}
mods="$work/kernel/lib/modules/$uname_r"
[ -d "$mods/kernel" ] || die "$kpkg has no lib/modules/$uname_r/kernel"

root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,etc,lib/modules,tmp,run,www}
cp "$bb" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
cp -R "$here/rootfs/." "$root/"

# dhcpcd and the part of glibc it needs: the dynamic loader at the path
# the binary names (PT_INTERP) and libc.so.6 in a directory the loader
# searches by default. Nothing else: no udev plugin, no hooks (the
# guest's /etc/dhcpcd.conf names its own script).
[ -x "$work/dhcpcd/usr/sbin/dhcpcd" ] || die "dhcpcd-base has no usr/sbin/dhcpcd"
cp "$work/dhcpcd/usr/sbin/dhcpcd" "$root/bin/dhcpcd"
libdir=lib/x86_64-linux-gnu
for f in "$libdir/ld-linux-x86-64.so.2" "$libdir/libc.so.6"; do
  src=$(readlink -f "$work/libc/$f")
  [ -f "$src" ] || die "libc6 has no $f"
  mkdir -p "$root/$(dirname "$f")"
  cp "$src" "$root/$f"
done
mkdir -p "$root/lib64"
ln -s "../$libdir/ld-linux-x86-64.so.2" "$root/lib64/ld-linux-x86-64.so.2"
# It runs with just these (here, with the image's loader and libc).
"$root/lib64/ld-linux-x86-64.so.2" --library-path "$root/$libdir" "$root/bin/dhcpcd" --version >/dev/null ||
  die "dhcpcd does not run with the image's glibc (libc6 $lver)"

# The modules: each wanted one after its dependencies (the "depends=" of
# its .modinfo), each once, decompressed into /lib/modules/<name>.ko and
# listed in load order in /lib/modules/load.list. Built-in ones
# (modules.builtin) need no loading.
declare -A modpath=() loaded=()
while IFS= read -r f; do
  n=${f##*/}
  n=${n%%.ko*}
  modpath[${n//-/_}]=$f
done < <(find "$mods/kernel" -name '*.ko*')
: >"$root/lib/modules/load.list"
addmod() {
  local m=$1 src dst d
  [ -z "${loaded[$m]:-}" ] || return 0
  loaded[$m]=1
  src=${modpath[$m]:-}
  if [ -z "$src" ]; then
    grep -Eq "/${m//_/[-_]}\.ko" "$mods/modules.builtin" 2>/dev/null ||
      die "kernel module $m is neither in $kpkg nor built in"
    return 0
  fi
  dst="$work/mod-$m.ko"
  case "$src" in
  *.ko) cp "$src" "$dst" ;;
  *.ko.xz)
    if command -v xz >/dev/null 2>&1; then xz -dc "$src" >"$dst"; else "$bb" xzcat "$src" >"$dst"; fi ;;
  *.ko.zst)
    need zstd zstd
    zstd -qdc "$src" >"$dst" ;;
  *.ko.gz) gzip -dc "$src" >"$dst" ;;
  *) die "unknown module format: $src" ;;
  esac
  for d in $(tr '\0' '\n' <"$dst" | sed -n 's/^depends=//p' | head -n1 | tr ',' ' '); do
    addmod "${d//-/_}"
  done
  mv "$dst" "$root/lib/modules/$m.ko"
  echo "$m" >>"$root/lib/modules/load.list"
}
for m in "${want_modules[@]}"; do addmod "$m"; done
[ -s "$root/lib/modules/load.list" ] || die "no virtio modules found in $kpkg"
chmod 0755 "$root/init" "$root/etc/rcS" "$root/etc/udhcpc.script" "$root/etc/dhcpcd.script" "$root"/bin/kvnet-*

(cd "$root" && find . | LC_ALL=C sort | "$bb" cpio -o -H newc 2>/dev/null) | gzip -9n >"$work/initramfs.cpio.gz"

# Publish: the stamp last, so an interrupted build is rebuilt next time.
rm -f "$out/stamp"
cp "$vmlinuz" "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
mv "$work/initramfs.cpio.gz" "$out/initramfs.cpio.gz"
{
  echo "kernel=$kpkg $kver ($uname_r)"
  echo "busybox=busybox-static $bver"
  echo "dhcpcd=dhcpcd-base $dver, libc6 $lver"
  echo "modules=$(tr '\n' ' ' <"$root/lib/modules/load.list")"
} >"$out/manifest"
echo "$stamp" >"$out/stamp"
log "built $out: vmlinuz ($uname_r), initramfs.cpio.gz ($(du -h "$out/initramfs.cpio.gz" | cut -f1)), modules: $(tr '\n' ' ' <"$root/lib/modules/load.list")"
