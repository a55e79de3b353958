package kvimages

// libvirtFiles are the virt-launcher image's libvirt configuration on
// top of Debian's packages: the settings KubeVirt's own image carries
// (its cmd/virt-launcher: qemu.conf, virtqemud.conf, the qemu hook) and a
// virtqemud standing in for libvirt's modular daemon, which Debian does
// not ship (see virtqemudWrapper).
func libvirtFiles() []entry {
	return []entry{
		{path: "etc/libvirt", dir: true, mode: 0o755},
		// Readable by all: a non-root virt-launcher copies it into its
		// private directory before adding its own lines.
		{path: "etc/libvirt/qemu.conf", mode: 0o644, content: []byte(qemuConf)},
		{path: "etc/libvirt/virtqemud.conf", mode: 0o644, content: []byte(virtqemudConf)},
		{path: "etc/libvirt/hooks", dir: true, mode: 0o755},
		{path: "etc/libvirt/hooks/qemu", mode: 0o755, content: []byte(qemuHook)},
		{path: "usr/sbin/virtqemud", mode: 0o755, content: []byte(virtqemudWrapper)},
		{path: "usr/lib/kvnet-lab", dir: true, mode: 0o755},
		{path: "usr/lib/kvnet-lab/virtqemud", link: "/usr/sbin/libvirtd"},
	}
}

// qemuConf is libvirt's QEMU driver configuration as KubeVirt expects it.
const qemuConf = `# libvirt QEMU driver settings of the kvnet lab's virt-launcher image
# (internal/lab/kvimages), as KubeVirt's virt-launcher expects them;
# virt-launcher appends its own lines at start.
# QEMU's console and log go through virtlogd, which virt-launcher runs.
stdio_handler = "logd"
# VNC on all addresses of the pod, without TLS or SASL: virt-handler
# proxies it.
vnc_listen = "0.0.0.0"
vnc_tls = 0
vnc_sasl = 0
# QEMU runs as KubeVirt's qemu user (107); libvirt hands it the files it
# needs and does not record their previous owners.
user = "qemu"
group = "qemu"
dynamic_ownership = 1
remember_owner = 0
# The pod is the isolation: no mount namespace per VM, no cgroups of
# libvirt's own.
namespaces = [ ]
cgroup_controllers = [ ]
`

// virtqemudConf is the daemon's configuration, which virt-launcher copies
// to /var/run/libvirt/virtqemud.conf and starts the daemon with (-f).
const virtqemudConf = `# libvirt daemon settings of the kvnet lab's virt-launcher image
# (internal/lab/kvimages): no network listeners (the unix socket only),
# logs to stderr, which virt-launcher forwards to the pod's log.
listen_tls = 0
listen_tcp = 0
log_outputs = "1:stderr"
`

// qemuHook is libvirt's qemu hook: when a migration's source domain is
// released, it tells virt-launcher (through a file KubeVirt watches) that
// the migration completed, as KubeVirt's image does.
const qemuHook = `#!/bin/sh
# libvirt qemu hook of the kvnet lab's virt-launcher image
# (internal/lab/kvimages): arguments are <domain> <operation> <sub-operation>
# <extra>. After a migration released the domain here, mark the backend
# storage as migrated for virt-launcher.
[ "$2" = release ] && [ "$3" = end ] && [ "$4" = migrated ] || exit 0
touch /run/kubevirt-private/backend-storage-meta/migrated
`

// virtqemudWrapper is /usr/sbin/virtqemud. KubeVirt starts
// /usr/sbin/virtqemud, libvirt's modular QEMU daemon, and connects to it on
// /var/run/libvirt/virtqemud-sock (virt-launcher as non-root, and
// virt-handler for migrations); Debian builds only libvirt's monolithic
// daemon, libvirtd, which serves the same QEMU driver on libvirt-sock in
// the same directory (as root, and as a user whose XDG_RUNTIME_DIR is
// /var/run, as KubeVirt sets it). The wrapper points the modular socket
// names at libvirtd's and starts libvirtd through a symlink named
// virtqemud, so that the process is called virtqemud (virt-handler looks
// for a child of virt-launcher by that name to raise its memlock limit).
const virtqemudWrapper = `#!/bin/sh
# virtqemud of the kvnet lab's virt-launcher image (internal/lab/kvimages):
# Debian's libvirtd standing in for libvirt's modular QEMU daemon.
dir=/var/run/libvirt
mkdir -p "$dir"
ln -sfn libvirt-sock "$dir/virtqemud-sock"
ln -sfn libvirt-sock-ro "$dir/virtqemud-sock-ro"
ln -sfn libvirt-admin-sock "$dir/virtqemud-admin-sock"
exec /usr/lib/kvnet-lab/virtqemud "$@"
`
