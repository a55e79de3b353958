package simlauncher

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	kubevirtv1 "kvnet.io/kvnet/api/kubevirt/v1"
	"kvnet.io/kvnet/internal/lab/simvirt"
	"kvnet.io/kvnet/internal/nl"
)

// stream returns the URI the source QEMU migrates to. Without a migration
// network (no targetNodeAddress) that is the target QEMU's own socket
// (uri). With one, as KubeVirt's virt-handlers proxy it, the stream goes
// from the source node's handler pod to the target node's, over the
// migration network: a local socket on the source side is relayed to
// targetNodeAddress, where the target handler relays it to the target
// QEMU. stop ends the relays.
func (l *Launcher) stream(ctx context.Context, source *running, uri string) (string, func(), error) {
	var vmi kubevirtv1.VirtualMachineInstance
	if err := l.reader.Get(ctx, source.vmi, &vmi); err != nil {
		return "", nil, err
	}
	ms := vmi.Status.MigrationState
	if ms == nil || ms.TargetNodeAddress == "" || l.cfg.PodNetNS == nil {
		return uri, func() {}, nil
	}
	srcNS, err := l.handlerNetNS(ctx, ms.SourceNode)
	if err != nil {
		return "", nil, err
	}
	dstNS, err := l.handlerNetNS(ctx, ms.TargetNode)
	if err != nil {
		return "", nil, err
	}
	var ln net.Listener
	if err := nl.Do(dstNS, func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(ms.TargetNodeAddress, "0"))
		return err
	}); err != nil {
		return "", nil, fmt.Errorf("target handler on %s: listen on the migration network at %s: %w", ms.TargetNode, ms.TargetNodeAddress, err)
	}
	target := strings.TrimPrefix(uri, "unix:")
	srcSock := filepath.Join(l.cfg.StateDir, filepath.Base(target)+".src")
	_ = os.Remove(srcSock)
	src, err := net.Listen("unix", srcSock)
	if err != nil {
		ln.Close()
		return "", nil, err
	}
	addr := ln.Addr().String()
	var wg sync.WaitGroup
	relay := func(accept net.Listener, dial func() (net.Conn, error)) {
		wg.Go(func() {
			in, err := accept.Accept()
			if err != nil {
				return
			}
			defer in.Close()
			out, err := dial()
			if err != nil {
				l.cfg.Log.Error(err, "migration relay")
				return
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(out, in); closeWrite(out); done <- struct{}{} }()
			go func() { _, _ = io.Copy(in, out); closeWrite(in); done <- struct{}{} }()
			<-done
			<-done
		})
	}
	relay(ln, func() (net.Conn, error) { return net.Dial("unix", target) })
	relay(src, func() (net.Conn, error) {
		var c net.Conn
		err := nl.Do(srcNS, func() (err error) {
			c, err = net.Dial("tcp4", addr)
			return err
		})
		return c, err
	})
	l.cfg.Log.Info("migration stream over the migration network", "vmi", source.vmi.String(),
		"from", ms.SourceNode, "to", addr)
	stop := func() {
		ln.Close()
		src.Close()
		wg.Wait()
		_ = os.Remove(srcSock)
	}
	return "unix:" + srcSock, stop, nil
}

// handlerNetNS is the network namespace of node's handler pod.
func (l *Launcher) handlerNetNS(ctx context.Context, node string) (string, error) {
	var pods corev1.PodList
	if err := l.reader.List(ctx, &pods); err != nil {
		return "", err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Name == simvirt.HandlerPodName(node) && p.Labels[kubevirtv1.AppLabel] == simvirt.HandlerValue && p.DeletionTimestamp == nil {
			return l.cfg.PodNetNS(p)
		}
	}
	return "", fmt.Errorf("no handler pod on node %s", node)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
