package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

// TestReadEnv reads the env file writeEnv writes.
func TestReadEnv(t *testing.T) {
	dir := t.TempDir()
	c := &Cluster{Dir: dir, Kubeconfig: filepath.Join(dir, KubeconfigFile), Registry: "10.89.0.1:5000",
		Images:         map[string]string{"busybox": "10.89.0.1:5000/kvnet-lab/busybox:lab", "kvnet-node": "x"},
		DefaultNetwork: NetworkFlannel, Multus: MultusThick, Nodes: []string{"node-1", "node-2"}}
	if err := c.writeEnv(); err != nil {
		t.Fatal(err)
	}
	env, err := ReadEnv(dir)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"REGISTRY": "10.89.0.1:5000", "BUSYBOX_IMAGE": "10.89.0.1:5000/kvnet-lab/busybox:lab",
		"KVNET_REGISTRY": "10.89.0.1:5000/kvnet", "KVNET_TAG": KvnetTag, "NODES": "node-1 node-2",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q", k, env[k], want)
		}
	}
}

// TestScenarioTargetFromDirNamesWhatIsMissing: a directory without a
// cluster, or an env file without the workload image, is an error naming
// the file and the key.
func TestScenarioTargetFromDirNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	if _, err := ScenarioTargetFromDir(dir); err == nil || !strings.Contains(err.Error(), EnvFile) {
		t.Errorf("no env file: got %v, want an error naming %s", err, EnvFile)
	}
	if err := os.WriteFile(filepath.Join(dir, EnvFile), []byte("REGISTRY=10.89.0.1:5000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: https://10.89.0.1:6443}}]\n" +
		"contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: x}}]\n"
	if err := os.WriteFile(filepath.Join(dir, KubeconfigFile), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ScenarioTargetFromDir(dir); err == nil || !strings.Contains(err.Error(), "BUSYBOX_IMAGE") {
		t.Errorf("env without BUSYBOX_IMAGE: got %v, want an error naming it", err)
	}
	if err := os.WriteFile(filepath.Join(dir, EnvFile), []byte("REGISTRY=10.89.0.1:5000\nBUSYBOX_IMAGE=b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tg, err := ScenarioTargetFromDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tg.Image != "b" || tg.EgressURL != "http://10.89.0.1:5000/v2/" || tg.Config.Host != "https://10.89.0.1:6443" {
		t.Errorf("target %+v: want image b, the registry's /v2/, the kubeconfig's server", tg)
	}
}

// TestRunPodScenariosRefusesOneNode: the pairs of pods need two nodes.
func TestRunPodScenariosRefusesOneNode(t *testing.T) {
	tg := ScenarioTarget{Config: &rest.Config{Host: "https://127.0.0.1:1"}, Client: fake.NewClientset(), Image: "b", Nodes: []string{"node-1"}}
	if _, err := RunPodScenarios(context.Background(), tg, nil); err == nil || !strings.Contains(err.Error(), "two different nodes") {
		t.Errorf("one node: got %v, want an error asking for two nodes", err)
	}
}

// TestRunPodScenariosRefusesUnknownSkip: a misspelt Skip would run the
// scenario it meant to leave out, or hide that the caller's list is
// stale; it is refused before anything is created.
func TestRunPodScenariosRefusesUnknownSkip(t *testing.T) {
	tg := ScenarioTarget{Config: &rest.Config{Host: "https://127.0.0.1:1"}, Client: fake.NewClientset(), Image: "b", Nodes: []string{"node-1", "node-2"},
		Skip: []string{ScenarioMatrix, "NoSuchScenario"}}
	if _, err := RunPodScenarios(context.Background(), tg, nil); err == nil || !strings.Contains(err.Error(), `"NoSuchScenario"`) {
		t.Errorf("Skip NoSuchScenario: got %v, want an error naming it", err)
	}
}

func TestScenarioResultString(t *testing.T) {
	if got := (ScenarioResult{Name: "x", OK: true, Detail: "d"}).String(); got != "PASS x: d" {
		t.Errorf("got %q", got)
	}
	if got := (ScenarioResult{Name: "x", Detail: "d"}).String(); got != "FAIL x: d" {
		t.Errorf("got %q", got)
	}
	if got := (ScenarioResult{Name: "x", Blocked: true, Detail: "d"}).String(); got != "BLOCKED x: d" {
		t.Errorf("got %q", got)
	}
	if got := (ScenarioResult{Name: "x", OK: true, Detail: "d", Took: 12345 * time.Millisecond}).String(); got != "PASS x [12.3s]: d" {
		t.Errorf("got %q", got)
	}
}
