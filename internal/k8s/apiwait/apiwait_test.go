package apiwait_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/rest"

	"kvnet.io/kvnet/internal/k8s/apiwait"
	"kvnet.io/kvnet/internal/testenv"
)

var fast = apiwait.Backoff{First: 10 * time.Millisecond, Max: 50 * time.Millisecond}

// TestWaitForLateAPIServer starts waiting while nothing listens at the API
// server's address, and only after two failed attempts opens it (a TCP
// relay to a real kube-apiserver): Wait returns nil once it answers.
func TestWaitForLateAPIServer(t *testing.T) {
	env, err := testenv.Start(testenv.Options{NoControllerManager: true})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	api, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	// An address nothing listens at yet.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	failures := make(chan string, 100)
	log := funcr.New(func(prefix, args string) {
		if strings.Contains(args, "not reachable yet") {
			failures <- args
		}
	}, funcr.Options{})
	cfg := *env.Config
	cfg.Host = "https://" + addr
	done := make(chan error, 1)
	go func() { done <- apiwait.Wait(context.Background(), &cfg, fast, log) }()
	for range 2 {
		select {
		case <-failures:
		case err := <-done:
			t.Fatalf("Wait returned %v while nothing listened at %s", err, addr)
		case <-time.After(30 * time.Second):
			t.Fatal("no failed attempt logged")
		}
	}
	relay(t, addr, api.Host)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return after the API server came up")
	}
}

// TestWaitStops: with the API server unreachable, Wait returns when its
// context ends, with an error naming the server and wrapping the
// context's.
func TestWaitStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	failures := make(chan struct{}, 100)
	log := funcr.New(func(string, string) { failures <- struct{}{} }, funcr.Options{})
	done := make(chan error, 1)
	go func() {
		done <- apiwait.Wait(ctx, &rest.Config{Host: "https://127.0.0.1:1"}, fast, log)
	}()
	<-failures
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "https://127.0.0.1:1") {
		t.Fatalf("Wait after cancel: %v; want context.Canceled naming the server", err)
	}
}

// relay accepts connections at addr, until the test ends, and copies each
// to and from target.
func relay(t *testing.T, addr, target string) {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
}
