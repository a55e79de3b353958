package cluster

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// Lines as virt-launcher v1.7.0's compute container logs libvirt's
// lifecycle events, and as kvnet-node logs a port's activation.
const (
	sourceLauncherLog = `{"component":"virt-launcher","level":"info","msg":"Domain started.","pos":"manager.go:1","timestamp":"2026-11-27T19:20:00.000000Z"}
{"component":"virt-launcher","level":"info","msg":"DomainLifecycle event Domain event=\"suspended\" detail=\"paused\" with event id 3 reason 0 received","pos":"client.go:503","timestamp":"2026-11-27T19:20:09.000000Z"}
{"component":"virt-launcher","level":"info","msg":"DomainLifecycle event Domain event=\"suspended\" detail=\"migrated\" with event id 3 reason 1 received","pos":"client.go:503","timestamp":"2026-11-27T19:20:10.100000Z"}
not json at all
{"component":"virt-launcher","level":"info","msg":"DomainLifecycle event Domain event=\"stopped\" detail=\"migrated\" with event id 5 reason 3 received","pos":"client.go:503","timestamp":"2026-11-27T19:20:10.900000Z"}
`
	targetLauncherLog = `{"component":"virt-launcher","level":"info","msg":"DomainLifecycle event Domain event=\"started\" detail=\"migrated\" with event id 2 reason 1 received","pos":"client.go:503","timestamp":"2026-11-27T19:20:01.000000Z"}
{"component":"virt-launcher","level":"info","msg":"DomainLifecycle event Domain event=\"resumed\" detail=\"migrated\" with event id 4 reason 1 received","pos":"client.go:503","timestamp":"2026-11-27T19:20:10.400000Z"}
`
	kvnetNodeLog = `{"level":"info","ts":"2026-11-27T19:19:00.000000000Z","msg":"migrated guest runs here; activated its port","port":"kvp0","mac":"0a:58:0a:00:00:05","frame":"RARP","activateMs":0.1,"activated":true}
{"level":"info","ts":"2026-11-27T19:20:10.450000000Z","msg":"migrated guest runs here; activated its port","port":"kvp1","mac":"0a:58:0a:00:00:09","frame":"RARP","activateMs":0.1,"activated":true}
{"level":"info","ts":"2026-11-27T19:20:10.460000000Z","msg":"migrated guest runs here; activated its port","port":"kvp2","mac":"0a:58:0a:00:00:05","frame":"IPv4 from 10.0.0.5","activateMs":0.1,"activated":true}
`
)

func TestMigrationBlackoutFromLogs(t *testing.T) {
	since := time.Date(2026, 11, 27, 19, 20, 0, 0, time.UTC)
	var b blackout
	var ok bool
	if b.suspended, ok = launcherEventTime(sourceLauncherLog, domainEventSuspended, domainEventSuspendedMigrate, since); !ok {
		t.Fatal("source: no suspended/migrated event found")
	}
	if b.resumed, ok = launcherEventTime(targetLauncherLog, domainEventResumed, domainEventResumedMigrated, since); !ok {
		t.Fatal("target: no resumed/migrated event found")
	}
	// The activation of this MAC after since, not another MAC's nor an
	// earlier one's.
	if b.activated, ok = kvnetActivatedTime(kvnetNodeLog, "0A:58:0A:00:00:05", since); !ok {
		t.Fatal("no activation found")
	}
	if d, _ := b.guestPause(); d != 300*time.Millisecond {
		t.Errorf("guest pause %s, want 300ms", d)
	}
	if d, _ := b.switchOver(); d != 60*time.Millisecond {
		t.Errorf("switch-over %s after the resume, want 60ms", d)
	}
	if s := b.String(); !strings.Contains(s, "guest paused 300 ms") || !strings.Contains(s, "60 ms after the resume") {
		t.Errorf("String() = %q", s)
	}
	// An event before since is another migration's.
	if _, ok := launcherEventTime(sourceLauncherLog, domainEventSuspended, domainEventSuspendedMigrate, since.Add(time.Minute)); ok {
		t.Error("found a suspended event before since")
	}
	if _, ok := kvnetActivatedTime(kvnetNodeLog, "0a:58:0a:00:00:07", since); ok {
		t.Error("found an activation of a MAC the log does not name")
	}
	var none blackout
	if _, ok := none.guestPause(); ok {
		t.Error("guest pause known without events")
	}
	if s := none.String(); !strings.Contains(s, "not in virt-launcher's logs") || !strings.Contains(s, "no port activation") {
		t.Errorf("String() of nothing = %q", s)
	}
}

func TestPingGaps(t *testing.T) {
	out := `PING 10.0.0.5 (10.0.0.5): 56 data bytes
64 bytes from 10.0.0.5: seq=0 ttl=64 time=0.512 ms
64 bytes from 10.0.0.5: seq=1 ttl=64 time=0.498 ms
64 bytes from 10.0.0.5: seq=2 ttl=64 time=0.498 ms
64 bytes from 10.0.0.5: seq=5 ttl=64 time=0.401 ms
64 bytes from 10.0.0.5: seq=5 ttl=64 time=0.401 ms (DUP!)
64 bytes from 10.0.0.5: seq=6 ttl=64 time=0.401 ms
64 bytes from 10.0.0.5: seq=40 ttl=64 time=0.401 ms
64 bytes from 10.0.0.5: seq=41 ttl=6`
	seqs := pingSeqs(out)
	if want := []int{0, 1, 2, 5, 6, 40, 41}; !slices.Equal(seqs, want) {
		t.Fatalf("pingSeqs = %v, want %v", seqs, want)
	}
	if gap, last := longestPingGap(seqs, 2); gap != 33*pingInterval || last != 41 {
		t.Errorf("after seq 2: gap %s, last %d; want %s, 41", gap, last, 33*pingInterval)
	}
	// The gap before after is the previous migration's.
	if gap, last := longestPingGap(seqs, 40); gap != 0 || last != 41 {
		t.Errorf("after seq 40: gap %s, last %d; want 0, 41", gap, last)
	}
	if gap, last := longestPingGap(seqs, 41); gap != 0 || last != 41 {
		t.Errorf("after seq 41: gap %s, last %d; want 0, 41", gap, last)
	}
}

func TestKvnetNodeNotes(t *testing.T) {
	since := time.Date(2026, 11, 27, 19, 20, 0, 0, time.UTC)
	log := `{"level":"error","ts":"2026-11-27T19:19:00Z","msg":"read announces","error":"before"}
{"level":"info","ts":"2026-11-27T19:20:01Z","msg":"applied"}
{"level":"info","ts":"2026-11-27T19:20:02Z","msg":"a migration target port went down; still waiting for its guest's first frame","port":"kvp1"}
{"level":"error","ts":"2026-11-27T19:20:03Z","msg":"read announces","error":"network is down"}
{"level":"error","ts":"2026-11-27T19:20:04Z","msg":"third"}
`
	got := kvnetNodeNotes(log, since, 2)
	if len(got) != 2 || !strings.Contains(got[0], "went down") || !strings.Contains(got[1], "network is down") {
		t.Errorf("kvnetNodeNotes = %q, want the target-port line and the error after since, at most 2", got)
	}
	b := blackout{nodeNotes: got}
	if s := b.String(); !strings.Contains(s, "no port activation in kvnet-node's log (its errors") || !strings.Contains(s, "network is down") {
		t.Errorf("blackout without activation: %q", s)
	}
}
