package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// linkUpdate is an update of a link called name.
func linkUpdate(name string) netlink.LinkUpdate {
	return netlink.LinkUpdate{Link: &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}}
}

// kicked reports whether the loop was kicked, and consumes the kick.
func kicked(a *Agent) bool {
	select {
	case <-a.trigger:
		return true
	default:
		return false
	}
}

// waitFor fails t if ch does not deliver within a generous bound (a
// liveness guard, not a measurement).
func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing after 10s", what)
	}
	var zero T
	return zero
}

func TestFollowLinks(t *testing.T) {
	// A failed subscription would be retried only after an hour: followLinks
	// must still return at once when its context ends.
	defer func(first, max time.Duration) { linkResubscribeFirst, linkResubscribeMax = first, max }(linkResubscribeFirst, linkResubscribeMax)
	linkResubscribeFirst, linkResubscribeMax = time.Hour, time.Hour

	a := &Agent{trigger: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(log.IntoContext(context.Background(), logr.Discard()))
	defer cancel()
	first, second := make(chan netlink.LinkUpdate), make(chan netlink.LinkUpdate)
	type result struct {
		ch  <-chan netlink.LinkUpdate
		err error
	}
	// Each subscription after the first takes the next result.
	results := make(chan result)
	calls := make(chan struct{})
	subscribe := func() (<-chan netlink.LinkUpdate, error) {
		calls <- struct{}{}
		r := <-results
		return r.ch, r.err
	}
	done := make(chan struct{})
	go func() {
		a.followLinks(ctx, first, subscribe)
		close(done)
	}()

	// Updates are unbuffered: once the next is taken, the previous one has
	// been handled.
	first <- linkUpdate("eth0")
	first <- linkUpdate("eth1")
	if kicked(a) {
		t.Fatal("an update of a link that is not kvnet's kicked the loop")
	}
	first <- linkUpdate("kvp0123456789")
	first <- linkUpdate("eth0")
	if !kicked(a) {
		t.Fatal("an update of a pod port (kvp…) did not kick the loop")
	}
	pod := linkUpdate("net1")
	pod.Attrs().Alias = "kvnet:ns/pod:ns/net"
	first <- pod
	first <- linkUpdate("eth0")
	if !kicked(a) {
		t.Fatal("an update of a link with a kvnet: alias did not kick the loop")
	}

	// The subscription fails: followLinks subscribes again and kicks the
	// loop for whatever it missed.
	close(first)
	waitFor(t, calls, "subscribing again after the updates closed")
	results <- result{ch: second}
	second <- linkUpdate("eth0") // taken: the kick for the gap is in
	if !kicked(a) {
		t.Fatal("no kick after subscribing again")
	}

	// It fails again, and so does subscribing: followLinks waits to retry
	// (an hour), and returns as soon as its context ends.
	close(second)
	waitFor(t, calls, "subscribing again after the second updates closed")
	results <- result{err: errors.New("netlink: no buffer space")}
	cancel()
	waitFor(t, done, "followLinks returning after its context ended, while waiting to subscribe again")
}
