package simlauncher

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/simvirt"
)

// scriptedReader is a client.Reader (a unit seam) serving one VMI and one
// pod, whose state the test changes between reads: after names reads
// of the VMI its migrationState names the target pod; after podGone reads
// of the pod, the pod is gone.
type scriptedReader struct {
	mu             sync.Mutex
	vmiReads       int
	podReads       int
	names, podGone int // 0: never
	target         string
}

func (r *scriptedReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch o := obj.(type) {
	case *kubevirtv1.VirtualMachineInstance:
		r.vmiReads++
		o.Name, o.Namespace = key.Name, key.Namespace
		if r.names > 0 && r.vmiReads >= r.names {
			o.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{TargetPod: r.target}
		}
	case *corev1.Pod:
		r.podReads++
		if r.podGone > 0 && r.podReads >= r.podGone {
			return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, key.Name)
		}
		o.Name, o.Namespace, o.UID = key.Name, key.Namespace, "uid-t"
	}
	return nil
}

func (r *scriptedReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return nil
}

func targetPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "virt-launcher-vm-t", UID: "uid-t",
		Labels:      map[string]string{simvirt.MigrationJobUIDLabel: "mig-uid"},
		Annotations: map[string]string{kubevirtv1.DomainAnnotation: "vm"}}}
}

// A migration target waits for its VMI to name it however late the
// control plane writes it (the chaos run's failure: a target gave up
// after 10 s while virt-controller was being restarted), and stops
// waiting once its pod is deleted.
func TestReadVMIWaitsForMigrationState(t *testing.T) {
	ctx := context.Background()
	// 120 reads at 100 ms: later than the old 10 s bound.
	r := &scriptedReader{names: 120, target: "virt-launcher-vm-t"}
	l := &Launcher{reader: r}
	start := time.Now()
	vmi, err := l.readVMI(ctx, targetPod())
	if err != nil {
		t.Fatalf("readVMI after %s: %v", time.Since(start), err)
	}
	if vmi.Status.MigrationState == nil || vmi.Status.MigrationState.TargetPod != "virt-launcher-vm-t" {
		t.Fatalf("VMI %+v does not name the target", vmi.Status)
	}

	r = &scriptedReader{podGone: 3}
	l = &Launcher{reader: r}
	_, err = l.readVMI(ctx, targetPod())
	if err == nil || !strings.Contains(err.Error(), "deleted before VMI ns/vm named it") {
		t.Fatalf("readVMI of a deleted target: %v, want it deleted", err)
	}
	if r.vmiReads != 3 {
		t.Errorf("read the VMI %d times, want 3: it went on after the pod was gone", r.vmiReads)
	}
}

// outageReader fails its first reads as an API server that is down does,
// then serves a pod; NotFound for any other name.
type outageReader struct {
	mu    sync.Mutex
	reads int
	down  int
}

func (r *outageReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	if key.Name != "p" {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, key.Name)
	}
	if r.reads <= r.down {
		return errors.New(`Get "https://127.0.0.1:6443/api/v1/namespaces/ns/pods/p": dial tcp 127.0.0.1:6443: connect: connection refused`)
	}
	obj.SetName(key.Name)
	return nil
}

func (r *outageReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return nil
}

// TestGetWaitsOutAPIOutage: the launcher's reads wait out an API server
// that refuses connections (a restart), but not past apiOutage, and a
// NotFound is final at once.
func TestGetWaitsOutAPIOutage(t *testing.T) {
	r := &outageReader{down: 3}
	l := &Launcher{reader: r}
	var p corev1.Pod
	if err := l.get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "p"}, &p); err != nil || p.Name != "p" {
		t.Fatalf("after 3 refused reads: %v (%q)", err, p.Name)
	}
	if r.reads != 4 {
		t.Errorf("%d reads, want 4", r.reads)
	}

	r = &outageReader{}
	l = &Launcher{reader: r}
	if err := l.get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "gone"}, &p); !apierrors.IsNotFound(err) || r.reads != 1 {
		t.Errorf("NotFound: %v after %d reads, want it at once", err, r.reads)
	}

	defer func(d time.Duration) { apiOutage = d }(apiOutage)
	apiOutage = 300 * time.Millisecond
	r = &outageReader{down: 1 << 30}
	l = &Launcher{reader: r}
	if err := l.get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "p"}, &p); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("an outage longer than apiOutage: %v, want the refusal", err)
	}
}
