package webhooks

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var admissionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "kvnet_webhook_admission_duration_seconds",
	Help:    "Time kvnet's webhooks take per admission request, by webhook.",
	Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
}, []string{"webhook"})

func init() { metrics.Registry.MustRegister(admissionSeconds) }
