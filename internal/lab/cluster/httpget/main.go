// Command httpget is the HTTP client of the real-cluster lab's busybox
// workload image (Debian's busybox wget crashes on the lab host's kernel).
//
//	httpget [-timeout 5s] [-cacert FILE] [-token FILE] URL
//	httpget -echo [-interval 20ms] HOST:PORT
//
// prints the response body to stdout and exits 0 on a 2xx status, 1 on any
// other status or error (named on stderr), 2 on bad usage. -cacert trusts
// the PEM certificates in FILE for https URLs (instead of the system's);
// -token sends FILE's contents as a bearer token: with a pod's
// ServiceAccount files, httpget is an in-cluster API client.
//
// With -echo it opens one TCP connection to an echo service and sends a
// numbered line (1, 2, ...) every interval, writing each line that comes
// back to stdout as it arrives; whenever more than five intervals pass
// between two answers it writes "gap <ms> before <line>" to stderr (a
// live migration's blackout as a TCP client sees it). It exits 1 when the
// connection ends.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	timeout := flag.Duration("timeout", 5*time.Second, "whole request timeout")
	cacert := flag.String("cacert", "", "PEM file of the CA certificates to trust for https")
	token := flag.String("token", "", "file holding a bearer token to send")
	echo := flag.Bool("echo", false, "send numbered lines to the echo service at HOST:PORT and report gaps")
	interval := flag.Duration("interval", 20*time.Millisecond, "with -echo: time between two lines")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: httpget [-timeout 5s] [-cacert FILE] [-token FILE] URL\n       httpget -echo [-interval 20ms] HOST:PORT")
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if *echo && *interval <= 0 {
		fmt.Fprintf(os.Stderr, "httpget: -interval %s: want a positive duration\n", *interval)
		os.Exit(2)
	}
	if *echo {
		os.Exit(echoProbe(flag.Arg(0), *timeout, *interval, os.Stdout, os.Stderr))
	}
	os.Exit(get(flag.Arg(0), *timeout, *cacert, *token))
}

// echoProbe is -echo, writing the lines back to out and the gaps to
// errOut: it returns when the connection ends.
func echoProbe(addr string, timeout, interval time.Duration, out, errOut io.Writer) int {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		fmt.Fprintln(errOut, "httpget:", err)
		return 1
	}
	defer conn.Close()
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := 1; ; i++ {
			if _, err := fmt.Fprintf(conn, "%d\n", i); err != nil {
				return
			}
			<-t.C
		}
	}()
	sc := bufio.NewScanner(conn)
	last := time.Now()
	for sc.Scan() {
		now := time.Now()
		if gap := now.Sub(last); gap > 5*interval {
			fmt.Fprintf(errOut, "gap %d before %s\n", gap.Milliseconds(), sc.Text())
		}
		last = now
		fmt.Fprintln(out, sc.Text())
	}
	fmt.Fprintln(errOut, "httpget: connection ended:", sc.Err())
	return 1
}

func get(url string, timeout time.Duration, cacert, tokenFile string) int {
	c := &http.Client{Timeout: timeout}
	if cacert != "" {
		b, err := os.ReadFile(cacert)
		if err != nil {
			fmt.Fprintln(os.Stderr, "httpget: -cacert:", err)
			return 1
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			fmt.Fprintf(os.Stderr, "httpget: -cacert %s: no PEM certificate in it\n", cacert)
			return 1
		}
		c.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	req, err := http.NewRequest(http.MethodGet, url, nil) //nolint:noctx // the client's timeout bounds it
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpget:", err)
		return 2
	}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "httpget: -token:", err)
			return 1
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpget:", err)
		return 1
	}
	defer resp.Body.Close()
	if _, err := io.Copy(os.Stdout, resp.Body); err != nil {
		fmt.Fprintln(os.Stderr, "httpget: read body:", err)
		return 1
	}
	if resp.StatusCode/100 != 2 {
		fmt.Fprintf(os.Stderr, "httpget: %s: %s\n", url, resp.Status)
		return 1
	}
	return 0
}
