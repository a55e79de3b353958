package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// tools are the programs the demo runs, as absolute paths.
type tools struct {
	ip      string // iproute2's ip: ip netns exec, ip -j addr
	busybox string // busybox ping, run inside pod namespaces
}

// lookTools finds the programs the demo runs with look (exec.LookPath),
// so that a missing one fails the demo at once with what to install, not
// later as a ping that "did not reach".
func lookTools(look func(string) (string, error)) (tools, error) {
	var t tools
	for _, tool := range []struct {
		name, pkg string
		path      *string
	}{
		{"ip", "iproute2", &t.ip},
		{"busybox", "busybox", &t.busybox},
	} {
		p, err := look(tool.name)
		if err != nil {
			return tools{}, fmt.Errorf("%s not found: install the Debian package %s (hack/install-deps.sh does)", tool.name, tool.pkg)
		}
		*tool.path = p
	}
	return t, nil
}

// probe is one ping from inside a pod's network namespace.
type probe struct {
	netns string // path of the namespace (/run/netns/<name>)
	addr  string // address pinged
}

func (p probe) String() string { return "ping " + p.addr }

// outcome is what a probe found.
type outcome int

const (
	// answered: a reply came back.
	answered outcome = iota
	// noAnswer: the probe went out and nothing answered (busybox ping's
	// exit status 1 with its statistics showing 0 packets received).
	noAnswer
	// failed: the probe could not be made (namespace or program missing,
	// no route, bad address, killed, ...): it says nothing about the
	// network under test.
	failed
)

// result is the outcome of one probe; err says why it failed.
type result struct {
	outcome outcome
	err     error
}

func (r result) String() string {
	switch r.outcome {
	case answered:
		return "answered"
	case noAnswer:
		return "no answer"
	default:
		return r.err.Error()
	}
}

// prober runs probes; tests fake it.
type prober interface {
	probe(ctx context.Context, p probe) result
}

// execProber runs probes with ip netns exec and busybox ping.
type execProber struct{ tools tools }

func (e execProber) probe(ctx context.Context, p probe) result {
	cmd := exec.CommandContext(ctx, e.tools.ip, "netns", "exec", filepath.Base(p.netns), e.tools.busybox, "ping", "-c", "1", "-W", "1", p.addr)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) || ctx.Err() != nil {
			return result{outcome: failed, err: fmt.Errorf("%s in %s: %w", p, filepath.Base(p.netns), err)}
		}
		code = exit.ExitCode()
	}
	r := classify(code, stdout.String(), stderr.String())
	if r.outcome == failed {
		r.err = fmt.Errorf("%s in %s: %w", p, filepath.Base(p.netns), r.err)
	}
	return r
}

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) packets received`)

// classify tells, from the exit status and output of `ip netns exec <ns>
// busybox ping -c 1`, whether the target answered, did not answer, or the
// ping could not be made. The exit status alone does not tell: busybox
// ping exits 1 for "no reply" but also for "bad address" or "sendto:
// Network is unreachable" (a pod without a network), and ip netns exec
// exits 1 when it cannot run busybox. Only a ping that went out (its
// statistics say so), got nothing back and reported no error is noAnswer.
func classify(code int, stdout, stderr string) result {
	fail := func(why string) result {
		msg := strings.TrimSpace(stderr)
		if msg == "" {
			msg = why
		}
		return result{outcome: failed, err: fmt.Errorf("exit status %d: %s", code, msg)}
	}
	m := pingStats.FindStringSubmatch(stdout)
	if m == nil {
		return fail("no ping statistics in the output")
	}
	sent, _ := strconv.Atoi(m[1])
	got, _ := strconv.Atoi(m[2])
	switch {
	case code == 0 && got > 0:
		return result{outcome: answered}
	case code == 1 && sent > 0 && got == 0 && strings.TrimSpace(stderr) == "":
		return result{outcome: noAnswer}
	}
	return fail(fmt.Sprintf("%d sent, %d received", sent, got))
}

// Tries of a probe: one that must be answered is retried (a port may be
// attached just now); one that must not is tried a few times, and any
// answer counts.
const (
	triesReach   = 10
	triesIsolate = 3
)

// expectAnswer runs p until it is answered, at most triesReach times, and
// returns the last result.
func expectAnswer(ctx context.Context, pr prober, p probe) result {
	var r result
	for range triesReach {
		if r = pr.probe(ctx, p); r.outcome == answered || ctx.Err() != nil {
			return r
		}
	}
	return r
}

// expectSilence runs p triesIsolate times: answered as soon as one is
// answered, failed as soon as one fails, else noAnswer.
func expectSilence(ctx context.Context, pr prober, p probe) result {
	var r result
	for range triesIsolate {
		if r = pr.probe(ctx, p); r.outcome != noAnswer {
			return r
		}
	}
	return r
}
