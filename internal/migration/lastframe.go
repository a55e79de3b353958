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

// LastFrame is the last frame a migrated guest sent on its source node,
// on one network, as that node's kvnet-node read it.
type LastFrame struct {
	Node string `json:"node"`
	// At is when kvnet-node read the frame (zero: it saw none while the
	// guest migrated); Frame says what it was ("IPv4 from 10.0.0.4").
	At    time.Time `json:"at,omitzero"`
	Frame string    `json:"frame,omitempty"`
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
