// Package simdns is the lab's cluster DNS, a stand-in for CoreDNS: it
// answers A and AAAA queries for Services (<service>.<namespace>.svc.<domain>)
// with their cluster IPs, read from the API server at each query, and
// NXDOMAIN for every other name. The lab runs it on its "internet"
// namespace behind the Service kube-system/kube-dns, whose EndpointSlice
// it keeps, so that pods and VMs on a primary UDN resolve cluster names as
// on a real cluster (kvnet's routers reach the Service's endpoints).
package simdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kvnet.io/kvnet/internal/nl"
)

// TTL is the time to live of every answer, in seconds: short, as the
// lab's Services come and go.
const TTL = 5

// Server answers DNS queries over UDP.
type Server struct {
	pc     net.PacketConn
	c      client.Reader
	domain string
}

// Listen opens UDP addr in the network namespace at nsPath ("": the
// current one) for the Services c reads, under domain (e.g.
// "cluster.local").
func Listen(nsPath, addr string, c client.Reader, domain string) (*Server, error) {
	var pc net.PacketConn
	listen := func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	}
	var err error
	if nsPath == "" {
		err = listen()
	} else {
		err = nl.Do(nsPath, listen)
	}
	if err != nil {
		return nil, fmt.Errorf("simdns: listen on %s: %w", addr, err)
	}
	return &Server{pc: pc, c: c, domain: strings.TrimSuffix(domain, ".")}, nil
}

// Addr is where the server listens.
func (s *Server) Addr() net.Addr { return s.pc.LocalAddr() }

// Close stops the server.
func (s *Server) Close() error { return s.pc.Close() }

// Serve answers queries until the server is closed or ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		s.pc.Close()
	}()
	buf := make([]byte, 1500)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if out, ok := s.answer(ctx, buf[:n]); ok {
			_, _ = s.pc.WriteTo(out, from)
		}
	}
}

// answer returns the reply to query q, if it is a query.
func (s *Server) answer(ctx context.Context, q []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil, false
	}
	question, err := p.Question()
	if err != nil {
		return nil, false
	}
	resp := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired},
		Questions: []dnsmessage.Question{question},
	}
	addrs, found, err := s.lookup(ctx, question.Name.String())
	switch {
	case err != nil:
		resp.RCode = dnsmessage.RCodeServerFailure
	case !found:
		resp.RCode = dnsmessage.RCodeNameError
	}
	for _, a := range addrs {
		rh := dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: TTL}
		switch {
		case a.Is4() && question.Type == dnsmessage.TypeA:
			rh.Type = dnsmessage.TypeA
			resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: rh, Body: &dnsmessage.AResource{A: a.As4()}})
		case a.Is6() && question.Type == dnsmessage.TypeAAAA:
			rh.Type = dnsmessage.TypeAAAA
			resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: rh, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
		}
	}
	out, err := resp.Pack()
	return out, err == nil
}

// lookup returns the cluster IPs of the Service name stands for
// ("<service>.<namespace>.svc.<domain>."), and whether it is one.
func (s *Server) lookup(ctx context.Context, name string) ([]netip.Addr, bool, error) {
	rest, ok := strings.CutSuffix(strings.ToLower(strings.TrimSuffix(name, ".")), ".svc."+s.domain)
	if !ok {
		return nil, false, nil
	}
	svcName, ns, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(ns, ".") {
		return nil, false, nil
	}
	var svc corev1.Service
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: svcName}, &svc); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil, false, nil
		}
		return nil, false, err
	}
	var out []netip.Addr
	for _, ip := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a)
		}
	}
	return out, true, nil
}
