package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"kvnet.io/kvnet/internal/datapath"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

type gaugeVec = prometheus.GaugeVec

// Metrics carry a node label: the lab and tests run several simulated
// nodes in one process.
var (
	applySeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_node_apply_duration_seconds",
		Help:    "Time to compute and apply the node's datapath state.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{"node"})
	planSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_node_plan_duration_seconds",
		Help:    "Time to compute the node's plan from the caches (part of kvnet_node_apply_duration_seconds).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"node"})
	cniLookupSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_node_cni_lookup_duration_seconds",
		Help:    "Time kvnet-node took to answer kvnet-cni's ADD on its socket with the pod's allocation (waiting for it included), by outcome: found, timeout, error.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
	}, []string{"node", "outcome"})
	applyErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_node_apply_errors_total",
		Help: "Failed applications of the datapath state (retried with backoff).",
	}, []string{"node"})
	portsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_ports",
		Help: "Pod ports attached to the network's bridge on the node.",
	}, []string{"node", "network"})
	remoteMACsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_remote_macs",
		Help: "Unicast FDB entries towards other nodes, per network.",
	}, []string{"node", "network"})
	remoteNodesGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_remote_nodes",
		Help: "Other nodes the network's broadcast is replicated to.",
	}, []string{"node", "network"})
	leasesGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_dhcp_leases",
		Help: "MACs the node's DHCP server answers for, per primary network.",
	}, []string{"node", "network"})
	waitingGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_waiting_ports",
		Help: "Local attachments whose interface kvnet-cni has not created yet.",
	}, []string{"node"})
	rulesSyncSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_node_rules_sync_duration_seconds",
		Help:    "Time to bring the node's nftables rules (anti-spoofing, Services, network policies) up to date in one apply.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"node"})
	policyPortsGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_policy_ports",
		Help: "Local ports isolated by network policies (NetworkPolicy on a primary network, MultiNetworkPolicy on a secondary one), per network.",
	}, []string{"node", "network"})
	policiesGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_policies",
		Help: "Network policies programmed on the node: those isolating at least one of its ports, per network.",
	}, []string{"node", "network"})
	switchoversTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_migration_switchovers_total",
		Help: "Live migrations whose network switched to this node, per network and trigger: first-frame (the guest's first frame on the target opened its port) or api (the VMI named the target before any frame of the guest was seen there).",
	}, []string{"node", "network", "trigger"})
	switchoverSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_migration_switchover_seconds",
		Help:    "From a migrated guest's first frame on the target node to its port there forwarding the guest's traffic.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"node", "network"})
	switchoverWaitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_migration_target_wait_seconds",
		Help:    "From a live migration's target port being ready for the guest to its switch-over (either trigger): the migration's transfer as the network sees it.",
		Buckets: prometheus.ExponentialBuckets(0.1, 2, 14),
	}, []string{"node", "network", "trigger"})
	darkSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvnet_migration_dark_seconds",
		Help: "From a migrated guest's last frame out of its port on the source node (as that node's kvnet-node read it) to its port on the target node forwarding its traffic: how long the VM's network was dark in the live migration.",
		// 10 ms to about 82 s.
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
	}, []string{"node", "network"})
	dnsQueries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_node_dns_proxy_queries_total",
		Help: "DNS queries of primary networks' pods through kvnet-node's DNS proxy, by outcome (answered, upstream-error, dropped).",
	}, []string{"node", "outcome"})
	dnsRewritten = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_node_dns_proxy_rewritten_records_total",
		Help: "A and AAAA records the DNS proxy rewrote from a pod's default-network address to its address on its primary network.",
	}, []string{"node"})
	watchedNetworksGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_watched_networks",
		Help: "Networks whose pods the node watches by their network label (--pod-scope=networks).",
	}, []string{"node"})
	readyGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_node_ready",
		Help: "1 once the agent has applied the datapath state since it started.",
	}, []string{"node"})
)

func init() {
	metrics.Registry.MustRegister(applySeconds, planSeconds, cniLookupSeconds, applyErrors, portsGauge, remoteMACsGauge, remoteNodesGauge, leasesGauge, waitingGauge, readyGauge,
		rulesSyncSeconds, policyPortsGauge, policiesGauge, switchoversTotal, switchoverSeconds, switchoverWaitSeconds, darkSeconds,
		dnsQueries, dnsRewritten, watchedNetworksGauge)
}

// policyCounts returns, per network of s, how many of its ports policies
// isolate and which policies do.
func policyCounts(s datapath.State) (ports map[string]int, policies map[string]map[string]bool) {
	netOf := map[string]string{} // host interface -> network
	for _, p := range s.Ports {
		netOf[p.HostIfName] = p.Network
	}
	ports, policies = map[string]int{}, map[string]map[string]bool{}
	for _, pp := range s.Policies {
		n := netOf[pp.Port]
		ports[n]++
		for _, d := range []*datapath.PolicyDirection{pp.Ingress, pp.Egress} {
			if d == nil {
				continue
			}
			if policies[n] == nil {
				policies[n] = map[string]bool{}
			}
			for _, name := range d.Policies {
				policies[n][name] = true
			}
		}
	}
	return ports, policies
}

// observeSwitchover counts a live migration's switch-over to this node.
func observeSwitchover(s Switchover) {
	switchoversTotal.WithLabelValues(s.Target, s.Network, s.Trigger).Inc()
	if s.Trigger == TriggerFirstFrame {
		switchoverSeconds.WithLabelValues(s.Target, s.Network).Observe(s.OpenedAfterFrame().Seconds())
	}
	if w := s.Waited(); w > 0 {
		switchoverWaitSeconds.WithLabelValues(s.Target, s.Network, s.Trigger).Observe(w.Seconds())
	}
	if d := s.Dark(); d > 0 {
		darkSeconds.WithLabelValues(s.Target, s.Network).Observe(d.Seconds())
	}
}
