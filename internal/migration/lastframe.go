package migration

import (
	"encoding/json"
	"fmt"
	"maps"
	"time"
)

// LastFramesAnnotation is set by kvnet-node on a live migration's source
// launcher pod when the API moved its VMI away: per network, the last
// frame the guest sent out of the pod's port on the source node. The
// target node's kvnet-node reads it to tell how long the VM's network was
// dark (from that frame to its port on the target forwarding the guest's
// traffic).
const LastFramesAnnotation = "kvnet.io/migration-last-frames"

// GuestArrivedAnnotation is set by kvnet-node on a live migration's target
// launcher pod when the guest's first frame reached its port there (the
// value: that frame's time, RFC 3339). The source node's kvnet-node then
// shuts the source pod's port (the guest left it) without waiting for
// KubeVirt to move the VMI: the source pod's own stack answers the
// guest's peers from the guest's address once the guest left.
const GuestArrivedAnnotation = "kvnet.io/migration-guest-arrived"

// LastFrame is the last frame a migrated guest sent on its source node,
// on one network, as that node's kvnet-node read it.
type LastFrame struct {
	Node string `json:"node"`
	// At is when kvnet-node read the frame (zero: it saw none while the
	// guest migrated); Frame says what it was ("IPv4 from 10.0.0.4").
	At    time.Time `json:"at,omitzero"`
	Frame string    `json:"frame,omitempty"`
	// Earlier are the frames read before it, oldest first, at most
	// MaxEarlierFrames: the source pod may send frames from the guest's
	// MAC and address after the guest left (its own stack), and the
	// target takes the last one before the guest ran there (Before).
	Earlier []SeenFrame `json:"earlier,omitempty"`
}

// SeenFrame is one frame read on a source port.
type SeenFrame struct {
	At    time.Time `json:"at"`
	Frame string    `json:"frame"`
}

// MaxEarlierFrames bounds LastFrame.Earlier.
const MaxEarlierFrames = 64

// Before returns the newest frame of f read at or before t, and how many
// of f's frames were read after t; ok is false if none was read by t.
func (f LastFrame) Before(t time.Time) (last SeenFrame, after int, ok bool) {
	if f.At.IsZero() {
		return SeenFrame{}, 0, false
	}
	all := append(f.Earlier[:len(f.Earlier):len(f.Earlier)], SeenFrame{At: f.At, Frame: f.Frame})
	for i := len(all) - 1; i >= 0; i-- {
		if !all[i].At.After(t) {
			return all[i], len(all) - 1 - i, true
		}
	}
	return SeenFrame{}, len(all), false
}

// ParseLastFrames reads a LastFramesAnnotation value: network name ->
// LastFrame. An entry without a node is an error naming the network.
func ParseLastFrames(s string) (map[string]LastFrame, error) {
	var m map[string]LastFrame
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", LastFramesAnnotation, err)
	}
	for n, f := range m {
		if f.Node == "" {
			return nil, fmt.Errorf("annotation %s: network %q: node is required, got %+v", LastFramesAnnotation, n, f)
		}
	}
	return m, nil
}

// MergeLastFrames returns the LastFramesAnnotation value with frames added
// to old (a value of the annotation, or ""; an unreadable one is
// replaced).
func MergeLastFrames(old string, frames map[string]LastFrame) string {
	m := map[string]LastFrame{}
	if old != "" {
		if prev, err := ParseLastFrames(old); err == nil {
			m = prev
		}
	}
	maps.Copy(m, frames)
	b, _ := json.Marshal(m)
	return string(b)
}
