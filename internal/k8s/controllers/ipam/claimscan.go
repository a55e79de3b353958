package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
)

// decodeHeldClaims decodes an IPAMClaimList (JSON) as it streams in,
// passes the claims that hold IPs to emit in batches, and returns the
// list's metadata. Claims emitted before an error are real claims of the
// response; the caller must not treat the list as complete.
//
// It reads only metadata.namespace, metadata.name, spec.network and
// status.ips of each item and skips the rest (managedFields, conditions)
// without decoding it: decoding typed claims with encoding/json took ~25
// µs per claim on the project's machine, ~3 µs here; at 100,000 claims
// that is seconds of CPU the API server serving the list can use instead. A response that is not an IPAMClaimList
// with an items array is an error, never "no claims".
func decodeHeldClaims(r io.Reader, emit func([]heldClaim)) (listMeta, error) {
	s := &jsonScanner{r: r, buf: make([]byte, 0, 64<<10)}
	meta, err := s.claimList(emit)
	if err != nil {
		return listMeta{}, fmt.Errorf("decode IPAMClaimList: %w", err)
	}
	return meta, nil
}

// claimBatch is how many claims decodeHeldClaims passes on at a time.
const claimBatch = 1024

// listMeta is the metadata of a list.
type listMeta struct {
	resourceVersion, continueToken string
}

var errSyntax = errors.New("malformed JSON")

// jsonScanner is a minimal streaming JSON reader over r.
type jsonScanner struct {
	r        io.Reader
	buf      []byte
	pos      int
	err      error // sticky read error (io.EOF at the end)
	interned map[string]string
}

// fill reads more input; it reports false at the end of input.
func (s *jsonScanner) fill() bool {
	if s.err != nil {
		return false
	}
	if s.pos > 0 {
		n := copy(s.buf, s.buf[s.pos:])
		s.buf, s.pos = s.buf[:n], 0
	}
	if len(s.buf) == cap(s.buf) {
		s.buf = append(s.buf, make([]byte, len(s.buf))...)[:len(s.buf)]
	}
	for {
		n, err := s.r.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		if err != nil {
			s.err = err
		}
		if n > 0 {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// next returns the next byte that is not whitespace, without consuming it.
func (s *jsonScanner) next() (byte, error) {
	for {
		for s.pos < len(s.buf) {
			switch c := s.buf[s.pos]; c {
			case ' ', '\t', '\n', '\r':
				s.pos++
			default:
				return c, nil
			}
		}
		if !s.fill() {
			return 0, s.readErr()
		}
	}
}

func (s *jsonScanner) readErr() error {
	if s.err == nil || errors.Is(s.err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return s.err
}

// expect consumes c, the next non-whitespace byte.
func (s *jsonScanner) expect(c byte) error {
	got, err := s.next()
	if err != nil {
		return err
	}
	if got != c {
		return fmt.Errorf("%w: expected %q, got %q", errSyntax, c, got)
	}
	s.pos++
	return nil
}

// more reports whether an object or array has another member, consuming
// the comma before it; close is '}' or ']', consumed at the end.
func (s *jsonScanner) more(first *bool, close byte) (bool, error) {
	c, err := s.next()
	if err != nil {
		return false, err
	}
	if c == close {
		s.pos++
		return false, nil
	}
	if *first {
		*first = false
		return true, nil
	}
	if c != ',' {
		return false, fmt.Errorf("%w: expected ',' or %q, got %q", errSyntax, close, c)
	}
	s.pos++
	return true, nil
}

// key reads an object key and its colon.
func (s *jsonScanner) key() (string, error) {
	k, err := s.str(false)
	if err != nil {
		return "", err
	}
	return k, s.expect(':')
}

// str reads a string; with intern, equal strings share memory.
func (s *jsonScanner) str(intern bool) (string, error) {
	if err := s.expect('"'); err != nil {
		return "", err
	}
	start := s.pos
	escaped := false
	for {
		for i := s.pos; i < len(s.buf); i++ {
			switch s.buf[i] {
			case '\\':
				escaped = true
				i++ // the escaped byte is never the closing quote
				if i >= len(s.buf) {
					s.pos = i - 1
					goto refill
				}
			case '"':
				raw := s.buf[start:i]
				s.pos = i + 1
				if escaped {
					return unquote(raw)
				}
				if intern {
					return s.intern(raw), nil
				}
				return string(raw), nil
			}
		}
		s.pos = len(s.buf)
	refill:
		// Keep the string's bytes: fill moves them to the start of buf.
		off := s.pos - start
		s.pos = start
		if !s.fill() {
			return "", s.readErr()
		}
		start, s.pos = s.pos, s.pos+off
	}
}

// optStr reads a string, or a null that leaves old, as encoding/json
// does.
func (s *jsonScanner) optStr(old string, intern bool) (string, error) {
	if isNull, err := s.null(); isNull || err != nil {
		return old, err
	}
	return s.str(intern)
}

func unquote(raw []byte) (string, error) {
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	var v string
	if err := json.Unmarshal(q, &v); err != nil {
		return "", fmt.Errorf("%w: string: %v", errSyntax, err)
	}
	return v, nil
}

func (s *jsonScanner) intern(b []byte) string {
	if v, ok := s.interned[string(b)]; ok {
		return v
	}
	if s.interned == nil {
		s.interned = map[string]string{}
	}
	v := string(b)
	s.interned[v] = v
	return v
}

// skip consumes one value of any type.
func (s *jsonScanner) skip() error {
	c, err := s.next()
	if err != nil {
		return err
	}
	switch c {
	case '"':
		return s.skipString()
	case '{', '[':
		return s.skipComposite()
	default: // number, true, false, null
		for {
			for s.pos < len(s.buf) {
				switch s.buf[s.pos] {
				case ',', '}', ']', ' ', '\t', '\n', '\r':
					return nil
				}
				s.pos++
			}
			if !s.fill() {
				if s.err != nil && !errors.Is(s.err, io.EOF) {
					return s.err
				}
				return nil // a scalar at the very end; the caller fails on what it misses
			}
		}
	}
}

// skipString consumes a string; the next byte is its opening quote.
func (s *jsonScanner) skipString() error {
	s.pos++
	for {
		for s.pos < len(s.buf) {
			switch s.buf[s.pos] {
			case '\\':
				if s.pos+1 >= len(s.buf) {
					goto refill
				}
				s.pos += 2
				continue
			case '"':
				s.pos++
				return nil
			}
			s.pos++
		}
	refill:
		if !s.fill() {
			return s.readErr()
		}
	}
}

// skipComposite consumes an object or array; the next byte opens it.
// Brackets inside strings do not count; the API server's JSON is
// well-formed, so matching the nesting depth is enough.
func (s *jsonScanner) skipComposite() error {
	depth := 0
	for {
		for s.pos < len(s.buf) {
			switch s.buf[s.pos] {
			case '"':
				if err := s.skipString(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.pos++
					return nil
				}
			}
			s.pos++
		}
		if !s.fill() {
			return s.readErr()
		}
	}
}

// null consumes a null if it is next.
func (s *jsonScanner) null() (bool, error) {
	c, err := s.next()
	if err != nil || c != 'n' {
		return false, err
	}
	return true, s.skip()
}

// object calls f with each key of an object (or nothing for null); f must
// consume the value.
func (s *jsonScanner) object(f func(key string) error) error {
	if isNull, err := s.null(); isNull || err != nil {
		return err
	}
	if err := s.expect('{'); err != nil {
		return err
	}
	for first := true; ; {
		ok, err := s.more(&first, '}')
		if err != nil || !ok {
			return err
		}
		k, err := s.key()
		if err != nil {
			return err
		}
		if err := f(k); err != nil {
			return err
		}
	}
}

// array calls f for each element of an array (or nothing for null); f
// must consume the element.
func (s *jsonScanner) array(f func() error) error {
	if isNull, err := s.null(); isNull || err != nil {
		return err
	}
	if err := s.expect('['); err != nil {
		return err
	}
	for first := true; ; {
		ok, err := s.more(&first, ']')
		if err != nil || !ok {
			return err
		}
		if err := f(); err != nil {
			return err
		}
	}
}

func (s *jsonScanner) claimList(emit func([]heldClaim)) (listMeta, error) {
	var (
		batch          []heldClaim
		meta           listMeta
		kind           string
		sawItems, seen bool
	)
	err := s.object(func(k string) error {
		seen = true
		switch k {
		case "items":
			sawItems = true
			err := s.array(func() error {
				c, err := s.claim()
				if err == nil && c.ipStrings > 0 {
					if batch == nil {
						batch = make([]heldClaim, 0, claimBatch)
					}
					if batch = append(batch, c.heldClaim); len(batch) == claimBatch {
						emit(batch)
						batch = nil
					}
				}
				return err
			})
			if len(batch) > 0 {
				emit(batch)
				batch = nil
			}
			return err
		case "kind":
			var err error
			kind, err = s.str(false)
			return err
		case "metadata":
			return s.object(func(k string) error {
				var err error
				switch k {
				case "resourceVersion":
					meta.resourceVersion, err = s.optStr(meta.resourceVersion, false)
				case "continue":
					meta.continueToken, err = s.optStr(meta.continueToken, false)
				default:
					err = s.skip()
				}
				return err
			})
		default:
			return s.skip()
		}
	})
	if err != nil {
		return listMeta{}, err
	}
	if !seen {
		return listMeta{}, fmt.Errorf("%w: not an object", errSyntax)
	}
	if c, err := s.next(); err == nil {
		return listMeta{}, fmt.Errorf("%w: %q after the list", errSyntax, c)
	}
	if kind != "IPAMClaimList" || !sawItems {
		return listMeta{}, fmt.Errorf("unexpected response: kind %q, items present: %v", kind, sawItems)
	}
	return meta, nil
}

type scannedClaim struct {
	heldClaim
	ipStrings int // entries of status.ips, parsable or not
}

// claim reads one IPAMClaim.
func (s *jsonScanner) claim() (scannedClaim, error) {
	var c scannedClaim
	err := s.object(func(k string) error {
		switch k {
		case "metadata":
			return s.object(func(k string) error {
				var err error
				switch k {
				case "namespace":
					c.key.Namespace, err = s.optStr(c.key.Namespace, true)
				case "name":
					c.key.Name, err = s.optStr(c.key.Name, false)
				default:
					err = s.skip()
				}
				return err
			})
		case "spec":
			return s.object(func(k string) error {
				if k != "network" {
					return s.skip()
				}
				var err error
				c.network, err = s.optStr(c.network, true)
				return err
			})
		case "status":
			return s.object(func(k string) error {
				if k != "ips" {
					return s.skip()
				}
				c.ips = c.ips[:0]
				c.ipStrings = 0
				return s.array(func() error {
					v, err := s.optStr("", false)
					if err != nil {
						return err
					}
					c.ipStrings++
					if p, err := netip.ParsePrefix(v); err == nil {
						c.ips = append(c.ips, p.Addr())
					}
					return nil
				})
			})
		default:
			return s.skip()
		}
	})
	return c, err
}
