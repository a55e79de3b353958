// Package policy compiles Kubernetes NetworkPolicies (networking.k8s.io/v1)
// into what one node enforces on one network: for each local endpoint (a
// pod, or a VM's launcher pod, with addresses on the network) whether it is
// isolated for ingress and for egress, and the entries that allow traffic
// through: a set of peer address prefixes, protocols and port ranges, each
// entry named after the policy that grants it (see Rule.Name), so that
// the datapath can name its sets and rules after policies and an operator
// tool can say which policy allowed or refused a connection.
//
// It is pure logic: it reads policies, namespaces and endpoints given by
// the caller and talks to no API server. Peers are addresses on the one
// network the Input describes: a namespace selector matches only the
// namespaces of that network (the namespaces a CUDN spans), never another
// network's, so two tenants never match each other whatever their labels.
// The compiled model (Compiled, PortPolicy, Rule) is independent of the
// NetworkPolicy API, so that other policy kinds (MultiNetworkPolicy on
// secondary networks) can be compiled into it as well.
package policy
