package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// profileWindow is the length of each CPU profile the scale run takes of
// kvnet-controller: a step is profiled in consecutive windows, the last
// one finished after the step ends (so no part of the step is lost).
const profileWindow = 5 * time.Second

// profiler takes CPU profiles of kvnet-controller from its pprof endpoint
// (addr, the controller's --pprof-addr) into dir.
type profiler struct {
	addr, dir string
	client    *http.Client
}

// during runs f, profiling kvnet-controller meanwhile in windows of
// profileWindow written to dir/controller-<step>-NN.pprof; it returns
// their paths. A window that fails (the controller restarted, say) is
// left out, and the first such error is returned beside f's.
func (p *profiler) during(ctx context.Context, step string, f func() error) ([]string, error) {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	var (
		wg      sync.WaitGroup
		paths   []string
		profErr error
	)
	wg.Go(func() {
		for n := 1; ; n++ {
			path := filepath.Join(p.dir, fmt.Sprintf("controller-%s-%02d.pprof", step, n))
			var retry <-chan time.Time // at once, unless the window failed
			if err := p.window(ctx, path); err != nil {
				if profErr == nil {
					profErr = fmt.Errorf("profile %s: %w", filepath.Base(path), err)
				}
				retry = time.After(time.Second)
			} else {
				paths = append(paths, path)
			}
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			default:
			}
			if retry != nil {
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				case <-retry:
				}
			}
		}
	})
	err := f()
	close(done)
	wg.Wait()
	return paths, errors.Join(err, profErr)
}

// window writes one CPU profile of profileWindow to path.
func (p *profiler) window(ctx context.Context, path string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.addr, int(profileWindow/time.Second))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
