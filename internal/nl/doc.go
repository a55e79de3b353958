// Package nl is kvnet's one door to netlink and network namespaces. Every
// other package goes through it instead of calling vishvananda/netlink or
// setns(2) directly, so that the three traps below are handled once.
//
// # Interrupted dumps
//
// Since vishvananda/netlink v1.2.1 a dump (LinkList, AddrList, RouteList,
// NeighList, …) whose kernel answer carried NLM_F_DUMP_INTR returns
// [netlink.ErrDumpInterrupted]: something changed while the kernel was
// walking the table, so the result may be incomplete. That happens under
// load (a pod being wired while we list links) and is not a failure: the
// [Handle] dump methods retry a few times and only then report the error.
//
// # Not found
//
// The kernel reports a missing object in several ways (ENODEV for links,
// ESRCH for routes, ENOENT for neighbours, EADDRNOTAVAIL for addresses,
// LinkNotFoundError from the library). [Handle] maps all of them to errors
// that match [ErrNotFound] with errors.Is, and its Del methods treat a
// missing object as already deleted, which is what idempotent
// Setup/Teardown verbs need.
//
// # Goroutines and network namespaces
//
// A network namespace belongs to an OS thread, not to a goroutine. Switching
// a thread with setns(2) while the Go scheduler may move the goroutine (or
// run other goroutines on that thread) leaks the namespace into unrelated
// code. The rules this package follows, and callers must follow too:
//
//   - Prefer not to switch at all. A [Handle] made by [NewHandle] owns
//     netlink sockets opened inside the target namespace; sockets keep their
//     namespace for life, so the handle can then be used from any goroutine.
//     nftables connections take the namespace's fd the same way.
//   - When code must run inside a namespace (sysctls under /proc/sys/net,
//     which resolve against the namespace of the opening thread; sockets for
//     tests), use [Do]. It locks the goroutine to its thread, switches, runs
//     the function, switches back and unlocks only if the switch back
//     worked; otherwise the thread is left locked so that the runtime
//     destroys it when the goroutine ends instead of reusing it.
//   - Goroutines started inside [Do] do NOT run in the namespace: they get
//     another thread. Do the namespace-sensitive part (socket creation,
//     netlink.NewHandle) synchronously inside the function; the resulting
//     file descriptors may then be used from anywhere.
//   - [Handle.PeerLink] looks up the peer of a veth in another namespace
//     by netns ID, without entering it (useful when only the local end is
//     known).
//   - Named namespaces are bind mounts under [NetNSDir], compatible with
//     `ip netns`. [CreateNamedNS] creates one from a throwaway locked thread
//     that is never unlocked, so no Go thread ever stays in the new namespace.
package nl
