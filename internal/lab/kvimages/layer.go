package kvimages

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one file, directory or symlink of a layer.
type entry struct {
	path     string // inside the image, without a leading "/"
	dir      bool
	link     string // a symlink to this target when set
	content  []byte // a regular file's content, unless src is set
	src      string // a regular file's content from this host file
	mode     int64
	uid, gid int
	xattrs   map[string]string // e.g. security.capability
}

// epoch is every entry's modification time: the layers are reproducible.
var epoch = time.Unix(0, 0)

// writeTar writes entries as a tar stream to w.
func writeTar(w io.Writer, entries []entry) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e.path, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: epoch, Format: tar.FormatPAX}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		var src *os.File
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, e.path+"/"
		case e.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.link, 0o777
		case e.src != "":
			f, err := os.Open(e.src)
			if err != nil {
				return fmt.Errorf("layer file %s: %w", e.path, err)
			}
			st, err := f.Stat()
			if err != nil {
				f.Close()
				return fmt.Errorf("layer file %s: %w", e.path, err)
			}
			h.Typeflag, h.Size, src = tar.TypeReg, st.Size(), f
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.content))
		}
		if err := tw.WriteHeader(h); err != nil {
			if src != nil {
				src.Close()
			}
			return fmt.Errorf("layer file %s: %w", e.path, err)
		}
		switch {
		case src != nil:
			_, err := io.Copy(tw, src)
			src.Close()
			if err != nil {
				return fmt.Errorf("layer file %s: %w", e.path, err)
			}
		case h.Typeflag == tar.TypeReg:
			if _, err := tw.Write(e.content); err != nil {
				return fmt.Errorf("layer file %s: %w", e.path, err)
			}
		}
	}
	return tw.Close()
}

// filesLayer is a layer of entries, streamed from the host files each time
// it is read (the binaries are large; nothing is held in memory).
func filesLayer(entries []entry) (v1.Layer, error) {
	for _, e := range entries {
		if e.path == "" || strings.HasPrefix(e.path, "/") || strings.HasSuffix(e.path, "/") {
			return nil, fmt.Errorf("layer entry path %q: want a relative path without a trailing /", e.path)
		}
		if e.src != "" {
			if _, err := os.Stat(e.src); err != nil {
				return nil, fmt.Errorf("layer file %s: %w", e.path, err)
			}
		}
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTar(pw, entries)) }()
		return pr, nil
	}, tarball.WithMediaType(types.OCILayer))
}

// gzipLayer is the layer of the tar file at path, compressed once into
// path+".gz" beside it (kept, so that the next push does not compress
// 500 MB again).
func gzipLayer(path string) (v1.Layer, error) {
	gz := path + ".gz"
	if _, err := os.Stat(gz); err != nil {
		if err := compress(path, gz); err != nil {
			return nil, err
		}
	}
	return tarball.LayerFromFile(gz, tarball.WithMediaType(types.OCILayer))
}

func compress(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("layer %s: %w", src, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+".tmp-*")
	if err != nil {
		return fmt.Errorf("layer %s: %w", src, err)
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	zw, err := gzip.NewWriterLevel(tmp, gzip.BestSpeed)
	if err != nil {
		return err
	}
	if _, err := io.Copy(zw, in); err != nil {
		tmp.Close()
		return fmt.Errorf("layer %s: compress: %w", src, err)
	}
	if err := zw.Close(); err != nil {
		tmp.Close()
		return fmt.Errorf("layer %s: compress: %w", src, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("layer %s: compress: %w", src, err)
	}
	return os.Rename(tmp.Name(), dst)
}

// fileCapability is the security.capability extended attribute (struct
// vfs_cap_data, revision 2, little endian) giving a file the capabilities
// caps in its permitted set, effective on exec: what `setcap cap_x+ep`
// writes.
func fileCapability(caps ...uint) string {
	const revision2, effective = 0x02000000, 0x1
	var permitted [2]uint32
	for _, c := range caps {
		permitted[c/32] |= 1 << (c % 32)
	}
	var b bytes.Buffer
	for _, v := range []uint32{revision2 | effective, permitted[0], 0, permitted[1], 0} {
		b.Write([]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)})
	}
	return b.String()
}
