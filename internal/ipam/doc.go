// Package ipam is the Kubernetes-free half of kvnet's central allocator:
// which attachments a pod has (primary UDN, networks annotation, kvnet-ipam
// NADs), what each asks for (static IPs, MAC, IPAMClaim), and how a
// network's NAD configuration becomes an allocator configuration.
//
// internal/k8s/controllers/ipam feeds it pods, namespaces, NADs and claims
// and writes the results (pod annotation, claim status).
package ipam
