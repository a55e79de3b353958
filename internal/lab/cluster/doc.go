// Package cluster runs a real Kubernetes cluster on one machine for the lab
// (`kvnet-lab cluster up|down`, make cluster-up, docs/cluster.md): the
// lab's control plane (package controlplane: etcd, kube-apiserver,
// kube-controller-manager) plus kube-scheduler on the host, a registry of
// the cluster's own, and nodes running a real kubelet and containerd.
//
// # Nodes
//
// Node i ("node-i") is a network namespace kvc-node-i attached by a veth to
// the host bridge [BridgeName] ([HostIP]/24 on the host, 10.89.0.(10+i) on
// the node's eth0), with a second veth (phys0, in the node's bridge
// [PhysNodeBridge]) to the datacenter bridge [PhysBridgeName] ([PhysHostIP]
// on the host) that localnet networks attach to, plus a mount and a PID
// namespace made by util-linux's
// unshare. In its mount namespace /run is a fresh tmpfs and the node's own
// directories under <dir>/nodes/node-i/root are bind-mounted over
// /var/lib/kubelet, /var/lib/containerd, /var/lib/cni, /var/log/pods,
// /var/log/containers, /etc/cni and /opt/cni/bin, so each node has its own
// kubelet, containerd and CNI state while sharing the host's binaries.
// Its PID namespace's init is a shell that starts containerd (Debian's,
// with runc) and the kubelet and reaps orphans; when it dies, the kernel
// kills everything in the node, containers included.
//
// The API server listens on [HostIP] (controlplane.InCluster): the host,
// the nodes and pods (through the kubernetes Service, with ServiceAccount
// tokens) all reach it there, so one kubeconfig works everywhere. The API
// server reaches kubelets at their InternalIP on the bridge. Each node
// runs kube-proxy (nftables mode) beside its kubelet.
//
// # Pod network
//
// The default network is Flannel (VXLAN), installed from
// manifests/flannel.yaml (upstream's kube-flannel.yml with the images the
// repo builds) once every node has its spec.podCIDR (which Up assigns:
// 10.244.i.0/24). With Config.DefaultNetwork "bridge", each node's
// default CNI network is instead the reference bridge plugin with
// host-local IPAM on that subnet, with routes between nodes: every node
// and the host route each other node's pod subnet to that node's address
// on the bridge. No NAT between pods either way. CoreDNS
// (manifests/coredns.yaml) answers at [DNSServiceIP].
//
// # Lifetime
//
// Every process started dies with the process that started it (a
// parent-death signal; unshare --kill-child; the PID namespace). [Cluster.Down]
// stops them and removes the namespaces, the bridge, the host routes, the
// nodes' cgroups and the state directory; [Cleanup] does the same for what a
// killed run left behind.
//
// Building needs root; a missing package or kernel feature stops [Up] at
// once, naming it ([Preflight]).
package cluster
