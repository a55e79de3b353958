// Module libnbd stands in for libguestfs.org/libnbd, which KubeVirt v1.8's
// virt-launcher imports for its backup/NBD export only
// (pkg/virt-launcher/virtwrap/storage/nbd_client.go) and which the Go
// module proxy this repository builds from refuses at every version. Every
// call fails: a VM backup through the real cluster's KubeVirt reports that
// error; nothing else in KubeVirt uses libnbd (docs/kubevirt-images.md).
module libguestfs.org/libnbd

go 1.24.0
