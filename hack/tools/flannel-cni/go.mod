// Module flannelcni pins the flannel CNI plugin, which reads flanneld's
// subnet.env and delegates to bridge and host-local, and portmap, for the
// real-cluster lab's Flannel image (hack/build-cluster-tools.sh).
// github.com/flannel-io/cni-plugin, where the plugin lives now, is refused
// by the Go module proxy at every version; containernetworking/plugins
// v0.9.1 is the last release that carried it (plugins/meta/flannel).
module kvnet.io/kvnet/hack/tools/flannel-cni

go 1.26.0

require github.com/containernetworking/plugins v0.9.1

require (
	github.com/Microsoft/go-winio v0.4.11 // indirect
	github.com/Microsoft/hcsshim v0.8.6 // indirect
	github.com/buger/jsonparser v0.0.0-20180808090653-f4dd9f5a6b44 // indirect
	github.com/containernetworking/cni v0.8.1 // indirect
	github.com/coreos/go-iptables v0.5.0 // indirect
	github.com/mattn/go-shellwords v1.0.3 // indirect
	github.com/sirupsen/logrus v1.0.6 // indirect
	github.com/vishvananda/netlink v1.1.1-0.20201029203352-d40f9887b852 // indirect
	github.com/vishvananda/netns v0.0.0-20200728191858-db3c7e526aae // indirect
	golang.org/x/crypto v0.0.0-20200622213623-75b288015ac9 // indirect
	golang.org/x/sys v0.0.0-20201117170446-d9b008d0a637 // indirect
)
