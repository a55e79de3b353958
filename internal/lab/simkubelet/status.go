package simkubelet

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// maxMessage bounds condition messages (plugin errors can be long).
const maxMessage = 4096

// updateStatus applies mutate to the pod's current status (read from the
// API server) and writes it through the status subresource when it
// changed. A pod that is gone, or replaced by another of the same name, is
// left alone.
func (k *kubelet) updateStatus(ctx context.Context, pod *corev1.Pod, mutate func(*corev1.Pod, *corev1.PodStatus)) error {
	pods := k.cs.CoreV1().Pods(pod.Namespace)
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return nil
		}
		st := cur.Status.DeepCopy()
		mutate(cur, st)
		if equality.Semantic.DeepEqual(*st, cur.Status) {
			return nil
		}
		cur.Status = *st
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// reportRunning writes phase Running, the Ready conditions, the pod IPs
// and running container statuses.
func (k *kubelet) reportRunning(ctx context.Context, key string, pod *corev1.Pod, st *podState) error {
	err := k.updateStatus(ctx, pod, func(cur *corev1.Pod, s *corev1.PodStatus) {
		now := metav1.Now()
		s.Phase = corev1.PodRunning
		s.PodIP, s.PodIPs = "", nil
		for _, ip := range st.ips {
			s.PodIPs = append(s.PodIPs, corev1.PodIP{IP: ip})
		}
		if len(st.ips) > 0 {
			s.PodIP = st.ips[0]
		}
		if s.StartTime == nil {
			s.StartTime = &now
		}
		for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
			setCondition(s, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue})
		}
		if !containersRunning(cur, s) {
			s.ContainerStatuses = nil
			for _, c := range cur.Spec.Containers {
				started := true
				s.ContainerStatuses = append(s.ContainerStatuses, corev1.ContainerStatus{
					Name: c.Name, Image: c.Image, ImageID: c.Image,
					ContainerID: fmt.Sprintf("simkubelet://%s/%s", cur.UID, c.Name),
					Ready:       true, Started: &started,
					State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
				})
			}
		}
	})
	if err != nil {
		return fmt.Errorf("pod %s: report Running: %w", key, err)
	}
	st.reported = true
	return nil
}

func containersRunning(pod *corev1.Pod, s *corev1.PodStatus) bool {
	if len(s.ContainerStatuses) != len(pod.Spec.Containers) {
		return false
	}
	for i, c := range pod.Spec.Containers {
		cs := s.ContainerStatuses[i]
		if cs.Name != c.Name || !cs.Ready || cs.State.Running == nil {
			return false
		}
	}
	return true
}

// setNotReady records why the pod's network is not up: Ready (and
// ContainersReady) False with the error. Failures to write are logged.
func (k *kubelet) setNotReady(ctx context.Context, key string, pod *corev1.Pod, msg string) {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage] + "..."
	}
	err := k.updateStatus(ctx, pod, func(_ *corev1.Pod, s *corev1.PodStatus) {
		if s.Phase == "" {
			s.Phase = corev1.PodPending
		}
		for _, t := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
			setCondition(s, corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: ReasonNetworkSetupFailed, Message: msg})
		}
	})
	if err != nil && ctx.Err() == nil {
		k.log.Error(err, "record pod not ready", "pod", key)
	}
}

// setFailed reports the pod Failed because its containers could not start
// (msg says why).
func (k *kubelet) setFailed(ctx context.Context, key string, pod *corev1.Pod, msg string) error {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage] + "..."
	}
	err := k.updateStatus(ctx, pod, func(_ *corev1.Pod, s *corev1.PodStatus) {
		s.Phase = corev1.PodFailed
		s.Reason, s.Message = ReasonContainerFailed, msg
		for _, t := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
			setCondition(s, corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: ReasonContainerFailed, Message: msg})
		}
	})
	if err != nil {
		return fmt.Errorf("pod %s: report Failed: %w", key, err)
	}
	return nil
}

// setCondition sets c in s, keeping the transition time when the status
// does not change.
func setCondition(s *corev1.PodStatus, c corev1.PodCondition) {
	for i := range s.Conditions {
		old := &s.Conditions[i]
		if old.Type != c.Type {
			continue
		}
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.Now()
		}
		c.LastProbeTime = old.LastProbeTime
		*old = c
		return
	}
	c.LastTransitionTime = metav1.Now()
	s.Conditions = append(s.Conditions, c)
}
