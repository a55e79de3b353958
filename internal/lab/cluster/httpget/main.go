// Command httpget is the HTTP client of the real-cluster lab's busybox
// workload image (Debian's busybox wget crashes on the lab host's kernel).
//
//	httpget [-timeout 5s] URL
//
// prints the response body to stdout and exits 0 on a 2xx status, 1 on any
// other status or error (named on stderr), 2 on bad usage.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	timeout := flag.Duration("timeout", 5*time.Second, "whole request timeout")
	flag.Usage = func() { fmt.Fprintln(os.Stderr, "usage: httpget [-timeout 5s] URL") }
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(get(flag.Arg(0), *timeout))
}

func get(url string, timeout time.Duration) int {
	c := &http.Client{Timeout: timeout}
	resp, err := c.Get(url)
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
