package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/utils/ptr"
)

// webPod is a busybox httpd pod on node serving "hello from <name>" on
// port 8080 (named http), labelled app=web: Ready once its page answers
// (an HTTP readiness probe), restarted if the port stops accepting (a
// TCP liveness probe).
//
// The real-cluster test requires that not one liveness probe fails
// (probesHeld): a startup probe on the same port holds the liveness and
// readiness probes back until httpd listens, however long a loaded node
// takes to start it, and each probe is given probeTimeout, not the
// default second, to be answered on a loaded node. A broken probe path
// still fails every probe: nothing answers.
func webPod(ns, name, node, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name:  "web",
				Image: image,
				Command: []string{"sh", "-c",
					"mkdir -p /tmp/www && echo hello from " + name + " > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				StartupProbe: &corev1.Probe{
					ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
					PeriodSeconds:    1,
					TimeoutSeconds:   probeTimeout,
					FailureThreshold: 120,
				},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:   corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}},
					PeriodSeconds:  1,
					TimeoutSeconds: probeTimeout,
				},
				LivenessProbe: &corev1.Probe{
					ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
					PeriodSeconds:    2,
					TimeoutSeconds:   probeTimeout,
					FailureThreshold: 3,
				},
			}},
		},
	}
}

// probeTimeout is how long webPod's probes wait for an answer, in
// seconds.
const probeTimeout = 3

// PodExec runs a command in pod ns/pod's first container through the API
// server's pods/exec subresource (as kubectl exec does) and returns its
// stdout and stderr. A command that ran and exited non-zero returns an
// error carrying its exit status (ExitStatus).
func PodExec(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, ns, pod string, cmd ...string) (stdout, stderr string, err error) {
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	var out, errb bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
	return out.String(), errb.String(), err
}

// ExitStatus is the exit status of a command PodExec ran, and false when
// err is not a command's non-zero exit (the exec itself failed).
func ExitStatus(err error) (int, bool) {
	var ee utilexec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitStatus(), true
	}
	return 0, false
}

// PodReady reports whether the pod's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// poll calls f until it returns nil, ctx ends or timeout passes, and
// returns f's last error then.
func poll(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	return pollEvery(ctx, timeout, time.Second, f)
}

// pollEvery is poll with tries interval apart.
func pollEvery(ctx context.Context, timeout, interval time.Duration, f func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// podNotReady describes why a pod is not Ready: its phase, conditions,
// container states and its latest events (a failed sandbox names the CNI
// plugin's error there).
func podNotReady(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			fmt.Fprintf(&b, "; %s=%s", c.Type, c.Status)
			if c.Message != "" {
				fmt.Fprintf(&b, " (%s)", c.Message)
			}
		}
	}
	for _, s := range p.Status.ContainerStatuses {
		switch {
		case s.State.Waiting != nil:
			fmt.Fprintf(&b, "; container %s waiting: %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
		case s.State.Terminated != nil:
			fmt.Fprintf(&b, "; container %s terminated: %s", s.Name, s.State.Terminated.Reason)
		}
		if s.RestartCount > 0 {
			fmt.Fprintf(&b, "; %d restarts", s.RestartCount)
		}
	}
	evs, err := cs.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", p.Name),
			fields.OneTermEqualSelector("involvedObject.kind", "Pod")).String(),
	})
	if err == nil {
		sort.Slice(evs.Items, func(i, j int) bool { return evs.Items[i].LastTimestamp.Before(&evs.Items[j].LastTimestamp) })
		var warnings []string
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning {
				warnings = append(warnings, e.Reason+": "+e.Message)
			}
		}
		if len(warnings) > 2 {
			warnings = warnings[len(warnings)-2:]
		}
		for _, w := range warnings {
			fmt.Fprintf(&b, "; event %s", w)
		}
	}
	return b.String()
}
