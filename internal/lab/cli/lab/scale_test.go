package lab

import (
	"math"
	"os"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// histogramQuantiles interpolates within the bucket holding the rank,
// sums only the series kept, and says nothing for an empty histogram.
func TestHistogramQuantiles(t *testing.T) {
	const text = `# TYPE d histogram
d_bucket{name="kvnet-a",le="0.005"} 10
d_bucket{name="kvnet-a",le="0.025"} 60
d_bucket{name="kvnet-a",le="0.1"} 100
d_bucket{name="kvnet-a",le="+Inf"} 100
d_sum{name="kvnet-a"} 3
d_count{name="kvnet-a"} 100
d_bucket{name="other",le="0.005"} 0
d_bucket{name="other",le="0.025"} 0
d_bucket{name="other",le="0.1"} 0
d_bucket{name="other",le="+Inf"} 1000
d_sum{name="other"} 9999
d_count{name="other"} 1000
`
	fams, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	q := histogramQuantiles(fams["d"], func(m *dto.Metric) bool { return strings.HasPrefix(labelOf(m, "name"), "kvnet") }, 1000)
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-6 }
	// p50: rank 50 in (5 ms, 25 ms] holding ranks 10..60; p99: rank 99
	// in (25 ms, 100 ms] holding 60..100.
	if q.N != 100 || !near(q.P50, 21) || !near(q.P99, 98.125) || !near(q.Sum, 3000) {
		t.Errorf("quantiles = %+v, want n 100, p50 21, p99 98.125, sum 3000", q)
	}
	// Past the last finite bucket, its bound is the estimate.
	if q := histogramQuantiles(fams["d"], func(m *dto.Metric) bool { return labelOf(m, "name") == "other" }, 1000); q.N != 1000 || q.P50 != 100 || q.P99 != 100 {
		t.Errorf("all past the last bucket: %+v, want n 1000, p50 and p99 100", q)
	}
	if q := histogramQuantiles(nil, nil, 1000); q != (Quantiles{}) {
		t.Errorf("no histogram: %+v, want zero", q)
	}
	if q := histogramQuantiles(fams["d"], func(*dto.Metric) bool { return false }, 1000); q != (Quantiles{}) {
		t.Errorf("nothing kept: %+v, want zero", q)
	}
}

// procCPUSeconds and procRSSMiB read this process's /proc files (the
// command in stat may hold spaces and parentheses; fields count from its
// end).
func TestProcFigures(t *testing.T) {
	if s := procCPUSeconds(0); s != 0 {
		t.Errorf("pid 0: %v CPU seconds, want 0", s)
	}
	// Work until the kernel has counted a tick of it (10 ms).
	x := 0
	for i := 0; procCPUSeconds(os.Getpid()) == 0 && i < 1e9; i++ {
		x += i % 7
	}
	if s := procCPUSeconds(os.Getpid()); s <= 0 {
		t.Errorf("own CPU %v s after work (%d), want > 0", s, x)
	}
	if rss, peak := procRSSMiB(os.Getpid()); rss <= 0 || peak < rss {
		t.Errorf("own RSS %v MiB, peak %v, want 0 < RSS <= peak", rss, peak)
	}
}
