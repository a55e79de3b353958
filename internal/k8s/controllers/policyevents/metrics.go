package policyevents

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// notEnforced counts the policies kvnet warned about, by kind: each
// isolates what it selects (kvnet fails closed) but admits less than its
// author wrote, or nothing.
var notEnforced = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kvnet_policies_not_enforced",
	Help: "NetworkPolicies and MultiNetworkPolicies with a Warning event in their latest evaluation: kvnet cannot enforce (part of) them as written; the pods they select stay isolated.",
}, []string{"kind"})

func init() { metrics.Registry.MustRegister(notEnforced) }
