// Package simkubelet is a stand-in for kubelet, the container runtime (CRI)
// and Multus on one simulated node, for the lab (`kvnet-lab`) and for
// privileged tests. It is never run in a cluster: a real node has a real
// kubelet.
//
// A simulated node is a network namespace (see package simnet). [Run]
// watches the pods scheduled to the node (spec.nodeName) and, for each:
//
//   - creates its "sandbox": a named network namespace
//     <PodNetNSPrefix><12 hex digits of the UID> under /run/netns with lo
//     up ([PodNetNS]);
//   - computes its attachments as Multus does for kvnet: the namespace's
//     primary user-defined network as ovn-udn1 (namespace labelled
//     k8s.ovn.org/primary-user-defined-network and a kvnet-cni NAD with
//     role primary), then each element of k8s.v1.cni.cncf.io/networks as
//     the element's interface or net<position>;
//   - runs CNI ADD for each through libcni, executing the plugins inside the
//     node namespace (`ip netns exec <node> <plugin>`), so host ends of
//     veths land in the node, as they would on a real node;
//   - reports the pod Running and Ready with the primary attachment's IPs
//     (or the first attachment's), or Ready=False naming the failed
//     attachment, retrying with backoff (2 s doubling to 30 s);
//   - on graceful deletion runs CNI DEL with the configuration cached at
//     ADD, removes the namespace and confirms the deletion (grace period 0,
//     UID precondition), as kubelet does; a pod that vanished (force
//     deletion) is torn down the same way.
//
// It reports its node as kubelet does: the Node (created when missing)
// is Ready (reason KubeletReady) with Config.NodeIP as its InternalIP and
// its name as Hostname, NodeInfo saying it is the lab's simulated kubelet,
// and every Config.HeartbeatInterval (10 s) it renews the Ready
// condition's lastHeartbeatTime and the node's Lease in kube-node-lease.
//
// No containers run: a pod is its network namespace, so tests `ip netns
// exec` (or nl.Do) into [PodNetNS] to ping from a pod.
//
// Plugins inside the node namespace see the node's loopback, not the
// caller's, so a control plane serving on 127.0.0.1 (envtest, the lab) is
// out of their reach; Config.LoopbackForwards relays such addresses into
// the node namespace (kvnet-cni's ADD reads the pod from the API server).
//
// Restarts behave like kubelet's over a surviving runtime: a Ready pod whose
// namespace still exists is adopted as is; on start, namespaces with the
// prefix and cached attachments that belong to no pod of the node are
// removed (after a CNI DEL). Hence PodNetNSPrefix and CNICacheDir must
// belong to this node alone. Stopping Run leaves pods and namespaces as
// they are.
package simkubelet
