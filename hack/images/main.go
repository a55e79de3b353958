// Command images builds kvnet's container images (make images): static
// binaries on an empty root file system, written as OCI image layouts and
// `docker save` tarballs under --out. No container daemon, no base image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"time"

	"kvnet.io/kvnet/internal/images"
)

func main() {
	out := flag.String("out", "_out/images", "directory the images are written to")
	registry := flag.String("registry", "ghcr.io/kvnet", "registry (and path) the images are named under")
	tag := flag.String("tag", "dev", "image tag")
	platforms := flag.String("platforms", "linux/"+runtime.GOARCH, "comma-separated platforms, e.g. linux/amd64,linux/arm64")
	flag.Parse()
	ps, err := images.ParsePlatforms(*platforms)
	if err != nil {
		fmt.Fprintln(os.Stderr, "images: --platforms:", err)
		os.Exit(2)
	}
	// SOURCE_DATE_EPOCH, as reproducible-builds.org defines it, sets the
	// creation time; without it the images carry the Unix epoch.
	created := time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "images: SOURCE_DATE_EPOCH=%q: not a number of seconds\n", s)
			os.Exit(2)
		}
		created = time.Unix(sec, 0).UTC()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
	if _, err := images.Build(ctx, images.Options{
		Repo: wd, Out: *out, Registry: *registry, Tag: *tag, Platforms: ps,
		Created: created, Log: os.Stdout,
	}); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}
