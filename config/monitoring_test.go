package config_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

type promRule struct {
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// TestAlertRules runs promtool on the PrometheusRule's alerts: `check
// rules` and the unit tests of monitoring/tests.yaml, which fire and
// resolve each alert on made-up series. Debian's prometheus package ships
// promtool; hack/install-deps.sh installs it.
func TestAlertRules(t *testing.T) {
	raw, err := os.ReadFile("monitoring/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var whole map[string]any
	if err := yaml.Unmarshal(raw, &whole); err != nil {
		t.Fatal(err)
	}
	spec, ok := whole["spec"].(map[string]any)
	if !ok {
		t.Fatal("prometheusrule.yaml has no spec")
	}
	rules, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kvnet.rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("monitoring/tests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tests.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}

	// Every alert has a runbook section in docs/operate.md and a test.
	var pr promRule
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		t.Fatal(err)
	}
	operate, err := os.ReadFile("../docs/operate.md")
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			anchor := "docs/operate.md#" + strings.ToLower(r.Alert)
			if r.Annotations["runbook"] != anchor {
				t.Errorf("alert %s: runbook %q, want %q", r.Alert, r.Annotations["runbook"], anchor)
			}
			if !regexp.MustCompile(`(?m)^#+ ` + r.Alert + `$`).Match(operate) {
				t.Errorf("alert %s: docs/operate.md has no heading %q", r.Alert, r.Alert)
			}
			if !strings.Contains(string(tests), "alertname: "+r.Alert+"\n") && !strings.Contains(string(tests), "alertname: "+r.Alert+",") {
				t.Errorf("alert %s: no test in monitoring/tests.yaml", r.Alert)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("prometheusrule.yaml has no alerts")
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		msg := "promtool not installed (Debian's prometheus package; hack/install-deps.sh installs it)"
		if os.Getenv("KVNET_REQUIRE_PRIVILEGED") == "1" {
			t.Fatal(msg + "; CI must run it")
		}
		t.Skip(msg)
	}
	for _, args := range [][]string{{"check", "rules", "kvnet.rules.yaml"}, {"test", "rules", "tests.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Logf("%d alerts checked and tested by promtool", alerts)
}
