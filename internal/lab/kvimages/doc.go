// Package kvimages assembles the real cluster's KubeVirt images and the
// lab guest's containerDisk, and pushes them to a registry: lab only, never
// linked by a shipped binary (docs/kubevirt-images.md).
//
// The inputs are built outside the clone, cached by version, by scripts
// (Build runs them):
//
//   - hack/build-kubevirt.sh: KubeVirt's binaries from the Go module
//     kubevirt.io/kubevirt (hack/tools/kubevirt pins the version);
//   - hack/build-kubevirt-rootfs.sh: the Debian root file system (libvirt,
//     QEMU) under virt-launcher and virt-handler, one layer;
//   - hack/guest/build-disk.sh: the lab guest as a bootable raw disk.
//
// Images names follow what virt-operator derives the other components'
// names from: its own image <registry>/<prefix>virt-operator:<tag> gives
// <registry>/<prefix>virt-api:<tag> and so on (KubeVirt's
// pkg/virt-operator/util/config.go), so Refs puts all five under
// <registry>/kubevirt/ with prefix "" and the KubeVirt version as tag.
package kvimages
