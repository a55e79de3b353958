package webhooks

import (
	"net/http"
	"sync/atomic"
)

// Drain lets a stopping replica hand its connections back one response
// at a time. The API server keeps its connections to a webhook open and
// reuses them for later calls (HTTP keep-alive), whatever the Service's
// endpoints say by then; when the replica stops serving it closes the
// idle ones, and a call the API server writes on one at that moment
// fails ("broken pipe"), failing the create it admits. Once Start is
// called, every response asks the API server to close its connection
// (Connection: close) after reading it, so that by the time the server
// stops, the connections in use have been closed by their client.
type Drain struct{ draining atomic.Bool }

// Start starts draining; it cannot be undone.
func (d *Drain) Start() { d.draining.Store(true) }

// Draining reports whether Start was called.
func (d *Drain) Draining() bool { return d.draining.Load() }

// Wrap returns h, whose responses close their connection once d drains.
// A nil d wraps nothing.
func (d *Drain) Wrap(h http.Handler) http.Handler {
	if d == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.Draining() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}
