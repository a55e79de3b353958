// Command httpget is the HTTP client of the real-cluster lab's busybox
// workload image (Debian's busybox wget crashes on the lab host's kernel).
//
//	httpget [-timeout 5s] [-cacert FILE] [-token FILE] URL
//
// prints the response body to stdout and exits 0 on a 2xx status, 1 on any
// other status or error (named on stderr), 2 on bad usage. -cacert trusts
// the PEM certificates in FILE for https URLs (instead of the system's);
// -token sends FILE's contents as a bearer token: with a pod's
// ServiceAccount files, httpget is an in-cluster API client.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	timeout := flag.Duration("timeout", 5*time.Second, "whole request timeout")
	cacert := flag.String("cacert", "", "PEM file of the CA certificates to trust for https")
	token := flag.String("token", "", "file holding a bearer token to send")
	flag.Usage = func() { fmt.Fprintln(os.Stderr, "usage: httpget [-timeout 5s] [-cacert FILE] [-token FILE] URL") }
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(get(flag.Arg(0), *timeout, *cacert, *token))
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
