package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestEchoProbeReportsGap runs -echo against an echo server that stalls
// once for 300 ms after the third line: every line comes back in order,
// one gap of at least 300 ms is reported before line 4, and the probe
// returns 1 when the server closes.
func TestEchoProbeReportsGap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		sc := bufio.NewScanner(c)
		for n := 1; n <= 8 && sc.Scan(); n++ {
			if n == 4 {
				time.Sleep(300 * time.Millisecond) // the stall the probe must see
			}
			if _, err := c.Write([]byte(sc.Text() + "\n")); err != nil {
				return
			}
		}
	}()
	var out, errOut bytes.Buffer
	if code := echoProbe(ln.Addr().String(), time.Second, 10*time.Millisecond, &out, &errOut); code != 1 {
		t.Errorf("exit %d when the connection ended, want 1", code)
	}
	if got := out.String(); got != "1\n2\n3\n4\n5\n6\n7\n8\n" {
		t.Errorf("lines back %q, want 1..8", got)
	}
	var gaps []string
	for _, l := range strings.Split(errOut.String(), "\n") {
		if strings.HasPrefix(l, "gap ") {
			gaps = append(gaps, l)
		}
	}
	if len(gaps) != 1 || !strings.HasSuffix(gaps[0], " before 4") {
		t.Fatalf("gaps %q, want one before line 4 (stderr %q)", gaps, errOut.String())
	}
	var ms int
	var before string
	if _, err := fmt.Sscanf(gaps[0], "gap %d before %s", &ms, &before); err != nil || ms < 300 {
		t.Errorf("gap %q: want at least 300 ms", gaps[0])
	}
}
