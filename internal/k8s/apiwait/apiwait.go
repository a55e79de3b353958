// Package apiwait waits for the Kubernetes API server at start-up.
//
// kvnet-controller and kvnet-node build their controller-runtime managers
// from the API's discovery data, so a manager made while the API server is
// unreachable (a node booting before the control plane, an API server
// restart) fails at once. Rather than exit and wait out the kubelet's
// crash-loop back-off (up to five minutes), both wait here, logging each
// failed attempt, until the API server answers or they are stopped.
package apiwait

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// Backoff is the wait between attempts: doubling from First to Max.
type Backoff struct {
	First, Max time.Duration
}

// DefaultBackoff waits 1 s after the first failure, then doubles up to 30 s.
var DefaultBackoff = Backoff{First: time.Second, Max: 30 * time.Second}

// Wait returns once the API server at cfg answers a version request, or
// ctx's error when ctx ends first. Each failed attempt is logged with the
// error and the wait before the next one.
func Wait(ctx context.Context, cfg *rest.Config, b Backoff, log logr.Logger) error {
	cfg = rest.CopyConfig(cfg)
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("API server %s: %w", cfg.Host, err)
	}
	wait := b.First
	for attempt := 1; ; attempt++ {
		_, err := dc.ServerVersion()
		if err == nil {
			if attempt > 1 {
				log.Info("API server reachable", "host", cfg.Host, "attempts", attempt)
			}
			return nil
		}
		log.Info("API server not reachable yet; retrying", "host", cfg.Host, "attempt", attempt, "retryIn", wait.String(), "error", err.Error())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("API server %s not reachable after %d attempts (last error: %v): %w", cfg.Host, attempt, err, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, b.Max)
	}
}
