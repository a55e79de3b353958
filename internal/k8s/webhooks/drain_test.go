package webhooks_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"

	"kvnet.io/kvnet/internal/k8s/webhooks"
)

// TestDrainClosesConnectionsAfterResponses: before Start a client reuses
// its connection to the webhook server; once draining, each response
// closes its connection, so the client's next call dials a new one and
// never writes on a connection the server is about to close. (Seen
// failing with Wrap not setting Connection: close: the call after the
// drain started reused the connection.)
func TestDrainClosesConnectionsAfterResponses(t *testing.T) {
	var d webhooks.Drain
	srv := httptest.NewServer(d.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
	defer srv.Close()
	client := srv.Client()
	call := func() (reused, closed bool) {
		t.Helper()
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodPost, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
		return reused, resp.Close
	}
	call()
	if reused, closed := call(); !reused || closed {
		t.Fatalf("before the drain: second call reused %v, response closes %v; want a kept-alive connection", reused, closed)
	}
	d.Start()
	if _, closed := call(); !closed {
		t.Errorf("draining: the response does not close its connection")
	}
	if reused, _ := call(); reused {
		t.Errorf("draining: the call after a drained response reused its connection")
	}
}
