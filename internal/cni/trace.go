package cni

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Tracing: where an ADD's time goes. When the directory traceDir exists
// (an admin or the benchmark makes it; nothing does by default), each
// ADD writes one JSON file there, <container ID>-<interface>.json: the
// duration of each phase in order (a Trace). It costs one stat when off.
var traceDir = hostFile{what: "kvnet-cni trace directory", env: "KVNET_CNI_TRACE_DIR", standard: "/var/lib/cni/kvnet/trace"}

// Trace is one traced ADD, as written to the trace directory.
type Trace struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Pod         string `json:"pod"`
	// Path is how kvnet's part ran: "node" (kvnet-node answered on its
	// socket) or "api" (kvnet-cni read the pod from the API server).
	Path string `json:"path"`
	// StartupMS is the process's start (exec, the Go runtime and package
	// initialisation) up to main, from /proc/self/stat: 10 ms steps.
	StartupMS float64 `json:"startupMs"`
	// CPUMS is the CPU time (user and system) of kvnet-cni's process,
	// start-up included; ChildCPUMS that of the plugins it ran (the
	// cluster default network's, with multus-default).
	CPUMS      float64 `json:"cpuMs"`
	ChildCPUMS float64 `json:"childCpuMs"`
	// Phases are the ADD's phases in order, in milliseconds.
	Phases []Phase   `json:"phases"`
	Total  float64   `json:"totalMs"`
	Error  string    `json:"error,omitempty"`
	Start  time.Time `json:"start"`
}

// Phase is one named step of an ADD.
type Phase struct {
	Name string  `json:"name"`
	MS   float64 `json:"ms"`
}

// tracer records the phases of one verb; a nil tracer records nothing.
type tracer struct {
	t     Trace
	start time.Time
	last  time.Time
}

// newTracer starts a trace at now.
func newTracer() *tracer {
	now := time.Now()
	return &tracer{start: now, last: now, t: Trace{Start: now, StartupMS: startupMS(now)}}
}

// mark ends phase name at now.
func (tr *tracer) mark(name string) {
	if tr == nil {
		return
	}
	now := time.Now()
	tr.t.Phases = append(tr.t.Phases, Phase{Name: name, MS: ms(now.Sub(tr.last))})
	tr.last = now
}

// path records which way kvnet's part went.
func (tr *tracer) path(p string) {
	if tr != nil {
		tr.t.Path = p
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// write stores the trace when the trace directory exists.
func (tr *tracer) write(containerID, ifName, pod string, err error) {
	if tr == nil {
		return
	}
	dir, ferr := traceDir.find(hostRoot, "", os.Getenv)
	if ferr != nil {
		return
	}
	tr.t.ContainerID, tr.t.IfName, tr.t.Pod = containerID, ifName, pod
	tr.t.Total = ms(time.Since(tr.start))
	tr.t.CPUMS, tr.t.ChildCPUMS = cpuMS(unix.RUSAGE_SELF), cpuMS(unix.RUSAGE_CHILDREN)
	if err != nil {
		tr.t.Error = err.Error()
	}
	b, merr := json.Marshal(tr.t)
	if merr != nil {
		return
	}
	name := filepath.Join(dir, containerID+"-"+ifName+".json")
	if werr := os.WriteFile(name, b, 0o644); werr != nil {
		fmt.Fprintf(os.Stderr, "kvnet-cni: write trace %s: %v\n", name, werr)
	}
}

// startupMS is the time from the process's start to now, from
// /proc/self/stat's start time (clock ticks since boot) and
// CLOCK_BOOTTIME; 0 when unreadable.
func startupMS(now time.Time) float64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields after its ")".
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64) // field 22: starttime
	if err != nil {
		return 0
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	const hz = 100 // USER_HZ on Linux
	started := time.Duration(ticks) * time.Second / hz
	d := time.Duration(ts.Nano()) - started - time.Since(now)
	if d < 0 {
		return 0
	}
	return ms(d)
}

// cpuMS is getrusage(who)'s user and system time in milliseconds.
func cpuMS(who int) float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		return 0
	}
	return ms(time.Duration(ru.Utime.Nano() + ru.Stime.Nano()))
}
