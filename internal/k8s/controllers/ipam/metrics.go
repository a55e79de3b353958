package ipam

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	allocationsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_ipam_allocations_total",
		Help: "Attachments given addresses, by network.",
	}, []string{"network"})
	failuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_ipam_allocation_failures_total",
		Help: "Failed attachment allocations, by network and reason (SubnetExhausted, IPAddressConflict, MACAddressConflict, InvalidRequest, MissingIPAMClaim, InternalError).",
	}, []string{"network", "reason"})
	poolSize = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_ipam_pool_size",
		Help: "Addresses available for automatic allocation, by network.",
	}, []string{"network"})
	poolUsed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_ipam_pool_used",
		Help: "Addresses in use, by network.",
	}, []string{"network"})
	reserveSets = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_ipam_restart_reserve_sets",
		Help: "Address sets (one address per subnet) the leader keeps free and recorded for its successor to hand out before its rebuild, by network.",
	}, []string{"network"})
	reserveAllocations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_ipam_restart_reserve_allocations_total",
		Help: "Attachments given addresses from the restart reserve, before the allocators were rebuilt, by network.",
	}, []string{"network"})
	allocationSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvnet_ipam_pod_allocation_duration_seconds",
		Help:    "Time from a pod's creation to its kvnet.io/pod-networks annotation being written.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
)

func init() {
	metrics.Registry.MustRegister(allocationsTotal, failuresTotal, poolSize, poolUsed, allocationSeconds, reserveSets, reserveAllocations)
}
