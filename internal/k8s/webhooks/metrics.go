package webhooks

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

var (
	admissionSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_webhook_admission_duration_seconds",
		Help:    "Time kvnet's webhooks take per admission request, by webhook.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"webhook"})
	admissions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_webhook_admissions_total",
		Help: "Admission requests kvnet's webhooks answered, by webhook and result: allowed, denied (the request is wrong: the user is told why) or error (kvnet could not decide: the create fails, failurePolicy Fail).",
	}, []string{"webhook", "result"})
)

func init() { metrics.Registry.MustRegister(admissionSeconds, admissions) }

// Counted serves h as webhook name: it counts h's answers in
// kvnet_webhook_admissions_total, and lets an admission in flight finish
// when the replica stops. The manager's stop (a rolling update, a drain)
// cancels every request's context while the server drains its
// connections; the API server would then report the create failed, so h
// gets a context that only its own deadline ends.
func Counted(name string, h admission.Handler) admission.Handler {
	return counted{name: name, h: h}
}

// admissionDeadline bounds one admission: the API server gives up on a
// webhook after its timeoutSeconds (10 s, config/webhook).
const admissionDeadline = 9 * time.Second

type counted struct {
	name string
	h    admission.Handler
}

func (c counted) Handle(ctx context.Context, req admission.Request) admission.Response {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), admissionDeadline)
	defer cancel()
	resp := c.h.Handle(ctx, req)
	admissions.WithLabelValues(c.name, result(resp)).Inc()
	return resp
}

// result classifies an answer: an error is a refusal with a 5xx code
// (kvnet could not decide), a denial any other refusal.
func result(resp admission.Response) string {
	switch {
	case resp.Allowed:
		return "allowed"
	case resp.Result != nil && resp.Result.Code >= http.StatusInternalServerError:
		return "error"
	}
	return "denied"
}
