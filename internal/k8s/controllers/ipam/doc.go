// Package ipam is kvnet's central allocator as a controller: it watches
// pods, gives every attachment of a pod to a kvnet network its IPs and MAC
// from in-memory allocators, fills and honours IPAMClaims, and writes the
// result once to the pod annotation kvnet.io/pod-networks.
//
// State lives in the API only: at start-up the allocators are rebuilt from
// IPAMClaims first, then pod annotations, and no pod is served before that
// is done. Decisions about what a pod asks for are in internal/ipam; the
// address arithmetic is in internal/ipam/allocator.
package ipam
