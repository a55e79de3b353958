package nodeids_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/k8s/controllers/nodeids"
	"kvnet.io/kvnet/internal/k8s/manager"
	"kvnet.io/kvnet/internal/testenv"
)

var (
	env *testenv.Env
	c   client.Client
	ctl *testenv.Controller
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testenv.Main(m, testenv.Options{}, func(e *testenv.Env) (manager.Options, error) {
		c = e.Client
		return manager.Options{}, nil
	}, &env, &ctl))
}

// ids waits until every named node holds a valid ID and returns them.
func ids(t *testing.T, names ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	testenv.Eventually(t, 30*time.Second, "node IDs", func() error {
		for _, name := range names {
			var n corev1.Node
			if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
				return err
			}
			id, ok := nodeids.Parse(&n)
			if !ok {
				return fmt.Errorf("node %s: annotation %q", name, n.Annotations[nodeids.Annotation])
			}
			out[name] = id
		}
		return nil
	})
	return out
}

func node(name, id string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if id != "" {
		n.Annotations = map[string]string{nodeids.Annotation: id}
	}
	return n
}

// TestNodeIDs: every node gets an ID no other node holds; a duplicate or
// invalid annotation (a node restored from a backup, a hand edit) is
// replaced; IDs survive a controller restart; a deleted node's ID is
// handed out again.
func TestNodeIDs(t *testing.T) {
	for _, n := range []*corev1.Node{node("ids-a", ""), node("ids-b", ""), node("ids-c", "")} {
		testenv.Create(t, c, n)
	}
	got := ids(t, "ids-a", "ids-b", "ids-c")
	if len(map[int]bool{got["ids-a"]: true, got["ids-b"]: true, got["ids-c"]: true}) != 3 {
		t.Fatalf("IDs %v are not unique", got)
	}

	testenv.Create(t, c, node("ids-dup", fmt.Sprint(got["ids-a"])))
	testenv.Create(t, c, node("ids-bad", "0x7"))
	after := ids(t, "ids-a", "ids-b", "ids-c", "ids-dup", "ids-bad")
	seen := map[int]string{}
	for name, id := range after {
		if other, dup := seen[id]; dup {
			t.Fatalf("nodes %s and %s both hold ID %d", name, other, id)
		}
		seen[id] = name
	}
	if after["ids-a"] != got["ids-a"] {
		t.Errorf("ids-a's ID moved from %d to %d when another node claimed it", got["ids-a"], after["ids-a"])
	}

	ctl.Restart(t)
	testenv.Create(t, c, node("ids-late", ""))
	restarted := ids(t, "ids-a", "ids-b", "ids-c", "ids-dup", "ids-bad", "ids-late")
	for name, id := range after {
		if restarted[name] != id {
			t.Errorf("after a controller restart node %s has ID %d, had %d", name, restarted[name], id)
		}
	}
	if _, taken := seen[restarted["ids-late"]]; taken {
		t.Errorf("a node added after the restart got ID %d, already held by %s", restarted["ids-late"], seen[restarted["ids-late"]])
	}

	// A deleted node's ID is free again: the next node may get it.
	freed := restarted["ids-b"]
	if err := c.Delete(context.Background(), node("ids-b", "")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "ID of ids-b handed out again", func() error {
		name := fmt.Sprintf("ids-next-%d", time.Now().UnixNano())
		n := node(name, "")
		if err := c.Create(context.Background(), n); err != nil {
			return err
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
		if id := ids(t, name)[name]; id != freed {
			return fmt.Errorf("new node got %d, want the freed %d", id, freed)
		}
		return nil
	})
}
