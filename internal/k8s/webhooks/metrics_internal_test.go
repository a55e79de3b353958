package webhooks

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

type answer admission.Response

func (a answer) Handle(context.Context, admission.Request) admission.Response {
	return admission.Response(a)
}

func TestCountedResults(t *testing.T) {
	for _, tc := range []struct {
		resp admission.Response
		want string
	}{
		{admission.Allowed("fine"), "allowed"},
		{admission.Denied("MAC 02:00:00:00:00:01 of interface \"sec\" is already used"), "denied"},
		{admission.Errored(http.StatusBadRequest, errors.New("bad object")), "denied"},
		{admission.Errored(http.StatusServiceUnavailable, errors.New("not ready")), "error"},
		{admission.Errored(http.StatusInternalServerError, errors.New("pool exhausted")), "error"},
	} {
		c := admissions.WithLabelValues("test", tc.want)
		before := testutil.ToFloat64(c)
		Counted("test", answer(tc.resp)).Handle(context.Background(), admission.Request{})
		if got := testutil.ToFloat64(c); got != before+1 {
			t.Errorf("%+v counted as %q %v times, want once", tc.resp.Result, tc.want, got-before)
		}
	}
}

type ctxErr struct{}

func (ctxErr) Handle(ctx context.Context, _ admission.Request) admission.Response {
	if err := ctx.Err(); err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		return admission.Errored(http.StatusInternalServerError, errors.New("no deadline"))
	}
	return admission.Allowed("")
}

// TestAdmissionOutlivesStop: the manager's stop cancels the request's
// context; the admission in flight still gets to answer, within its own
// deadline.
func TestAdmissionOutlivesStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if resp := Counted("test", ctxErr{}).Handle(ctx, admission.Request{}); !resp.Allowed {
		t.Fatalf("admission with a cancelled request context: %+v", resp.Result)
	}
}
