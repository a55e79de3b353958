package macpool

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	poolSize = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_macpool_size", Help: "MACs the pool can hand out.",
	})
	poolUsed = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_macpool_used", Help: "MACs of the range held by VMs.",
	})
	duplicateMACs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_macpool_duplicate_macs_total", Help: "MACs found on a VM while another VM holds them (at the rebuild or on a VM update).",
	})
	abandonedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_macpool_abandoned_released_total", Help: "MAC reservations deleted because the VM admission that made them never reached the API, or the VM no longer carries the MAC.",
	})
	reservationsCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_macpool_reservations_created_total", Help: "MAC reservations this replica created in the API.",
	})
	allocationConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_macpool_allocation_conflicts_total", Help: "Candidate MACs another replica reserved first; the allocation moved on to the next.",
	})
	collisions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_mac_collisions", Help: "Running VMIs using each MAC; above 1 is a collision.",
	}, []string{"mac"})
)

func init() {
	metrics.Registry.MustRegister(poolSize, poolUsed, duplicateMACs, abandonedTotal, reservationsCreated, allocationConflicts, collisions)
}
