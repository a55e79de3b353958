package node

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"kvnet.io/kvnet/internal/cni"
)

// writeStatus writes the status file kvnet-cni's STATUS verb reads,
// atomically (rename), and only when it changes.
func (a *Agent) writeStatus(ctx context.Context, ready bool, exhausted []string, unserved map[string]string) {
	if a.cfg.StatusFile == "-" {
		return
	}
	st := cni.Status{Ready: ready, ExhaustedNetworks: exhausted, UnservedNetworks: unserved, PodMTU: a.dp.MTU(), AllowDefaultNetwork: a.cfg.AllowDefaultNetwork}
	if st.ExhaustedNetworks == nil {
		st.ExhaustedNetworks = []string{}
	}
	a.mu.Lock()
	same := a.statusWritten && a.status.Ready == st.Ready && a.status.PodMTU == st.PodMTU &&
		slices.Equal(a.status.ExhaustedNetworks, st.ExhaustedNetworks) && maps.Equal(a.status.UnservedNetworks, st.UnservedNetworks)
	a.mu.Unlock()
	if same {
		return
	}
	b, _ := json.Marshal(st)
	err := os.MkdirAll(filepath.Dir(a.cfg.StatusFile), 0o755)
	if err == nil {
		tmp := a.cfg.StatusFile + ".tmp"
		if err = os.WriteFile(tmp, append(b, '\n'), 0o644); err == nil {
			err = os.Rename(tmp, a.cfg.StatusFile)
		}
	}
	if err != nil {
		log.FromContext(ctx).Error(err, "write the CNI status file", "path", a.cfg.StatusFile)
		return
	}
	a.mu.Lock()
	a.status, a.statusWritten = st, true
	a.mu.Unlock()
}
