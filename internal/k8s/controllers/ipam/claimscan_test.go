package ipam

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/types"
)

// claimJSON is an IPAMClaim as the API server serves it.
func claimJSON(ns, name, network string, ips ...string) string {
	q, _ := json.Marshal(ips)
	return fmt.Sprintf(`{"apiVersion":"k8s.cni.cncf.io/v1alpha1","kind":"IPAMClaim","metadata":{"creationTimestamp":"2026-11-22T00:45:00Z","generation":1,`+
		`"managedFields":[{"apiVersion":"k8s.cni.cncf.io/v1alpha1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{".":{},"f:network":{}}},"manager":"kvnet","operation":"Update","time":"2026-11-22T00:45:00Z"},`+
		`{"apiVersion":"k8s.cni.cncf.io/v1alpha1","fieldsType":"FieldsV1","fieldsV1":{"f:status":{".":{},"f:ips":{},"f:conditions":{}}},"manager":"kvnet","operation":"Update","subresource":"status","time":"2026-11-22T00:45:00Z"}],`+
		`"name":%q,"namespace":%q,"resourceVersion":"4711","uid":"0b3c6a8e-6a8e-4f5e-9d3e-1234567890ab"},"spec":{"network":%q},`+
		`"status":{"conditions":[{"lastTransitionTime":"2026-11-22T00:45:00Z","message":"IP addresses \"successfully\" allocated [x]","reason":"SuccessfulAllocation","status":"True","type":"IPsAllocated"}],"ips":%s,"ownerPod":{"name":"virt-launcher-x"}}}`,
		name, ns, network, q)
}

func listJSON(items ...string) string {
	return `{"apiVersion":"k8s.cni.cncf.io/v1alpha1","items":[` + strings.Join(items, ",") + `],"kind":"IPAMClaimList","metadata":{"continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ","resourceVersion":"4712"}}` + "\n"
}

// referenceDecode is decodeHeldClaims written with encoding/json, with
// exact (case-sensitive) keys, as the API server writes and Kubernetes
// reads them.
func referenceDecode(data []byte) ([]heldClaim, listMeta, error) {
	var top any
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, listMeta{}, err
	}
	list, ok := top.(map[string]any)
	if !ok {
		return nil, listMeta{}, errors.New("not an object")
	}
	var meta listMeta
	md, err := objectOrNull(list, "metadata")
	if err != nil {
		return nil, listMeta{}, err
	}
	if meta.resourceVersion, err = stringOrNull(md, "resourceVersion"); err != nil {
		return nil, listMeta{}, err
	}
	if meta.continueToken, err = stringOrNull(md, "continue"); err != nil {
		return nil, listMeta{}, err
	}
	items, present := list["items"]
	if !present {
		return nil, listMeta{}, errors.New("no items")
	}
	if items != nil {
		if _, ok := items.([]any); !ok {
			return nil, listMeta{}, errors.New("items not an array")
		}
	}
	var out []heldClaim
	for _, it := range asArray(items) {
		if it == nil {
			continue
		}
		item, ok := it.(map[string]any)
		if !ok {
			return nil, listMeta{}, errors.New("item not an object")
		}
		var c heldClaim
		var ipStrings int
		m, err := objectOrNull(item, "metadata")
		if err != nil {
			return nil, listMeta{}, err
		}
		if c.key.Namespace, err = stringOrNull(m, "namespace"); err != nil {
			return nil, listMeta{}, err
		}
		if c.key.Name, err = stringOrNull(m, "name"); err != nil {
			return nil, listMeta{}, err
		}
		spec, err := objectOrNull(item, "spec")
		if err != nil {
			return nil, listMeta{}, err
		}
		if c.network, err = stringOrNull(spec, "network"); err != nil {
			return nil, listMeta{}, err
		}
		status, err := objectOrNull(item, "status")
		if err != nil {
			return nil, listMeta{}, err
		}
		if ips := status["ips"]; ips != nil {
			arr, ok := ips.([]any)
			if !ok {
				return nil, listMeta{}, errors.New("ips not an array")
			}
			for _, v := range arr {
				s, ok := v.(string)
				if !ok && v != nil {
					return nil, listMeta{}, errors.New("ip not a string")
				}
				ipStrings++
				if p, err := netip.ParsePrefix(s); err == nil {
					c.ips = append(c.ips, p.Addr())
				}
			}
		}
		if ipStrings > 0 {
			out = append(out, c)
		}
	}
	kind, err := stringOrNull(list, "kind")
	if err != nil || kind != "IPAMClaimList" {
		return nil, listMeta{}, fmt.Errorf("kind %q", kind)
	}
	return out, meta, nil
}

func asArray(v any) []any {
	a, _ := v.([]any)
	return a
}

// objectOrNull returns o[key] as an object; absent or null is empty.
func objectOrNull(o map[string]any, key string) (map[string]any, error) {
	switch v := o[key].(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return v, nil
	default:
		return nil, fmt.Errorf("%s: not an object", key)
	}
}

// stringOrNull returns o[key] as a string; absent or null is "".
func stringOrNull(o map[string]any, key string) (string, error) {
	switch v := o[key].(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	default:
		return "", fmt.Errorf("%s: not a string", key)
	}
}

// duplicateKeys reports whether an object of the (valid) JSON document has
// a key twice; encoding/json and decodeHeldClaims may then differ, and the
// API server never writes one.
func duplicateKeys(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	var walk func() bool
	walk = func() bool {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, _ := dec.Token()
				if seen[k.(string)] {
					return true
				}
				seen[k.(string)] = true
				if walk() {
					return true
				}
			}
			_, _ = dec.Token()
		case json.Delim('['):
			for dec.More() {
				if walk() {
					return true
				}
			}
			_, _ = dec.Token()
		}
		return false
	}
	return walk()
}

// decodeAll is decodeHeldClaims collecting every batch.
func decodeAll(r io.Reader) ([]heldClaim, listMeta, error) {
	var all []heldClaim
	meta, err := decodeHeldClaims(r, func(c []heldClaim) {
		if len(c) == 0 || len(c) > claimBatch {
			panic(fmt.Sprintf("batch of %d", len(c)))
		}
		all = append(all, c...)
	})
	if err != nil {
		return nil, listMeta{}, err
	}
	return all, meta, nil
}

func normalize(cs []heldClaim) []heldClaim {
	for i := range cs {
		if len(cs[i].ips) == 0 {
			cs[i].ips = nil
		}
	}
	if len(cs) == 0 {
		return nil
	}
	return cs
}

func TestDecodeHeldClaims(t *testing.T) {
	list := listJSON(
		claimJSON("ns1", "vm1.blue", "ns1_blue", "10.0.0.5/24", "fd00::5/64"),
		claimJSON("ns1", "vm2.blue", "ns1_blue"), // holds nothing
		claimJSON("ns2", `vm\"3`, "ns2_red", "192.168.1.7/24"),
		claimJSON("ns2", "vm4.red", "ns2_red", "garbage"), // held, no parsable IP
	)
	want := []heldClaim{
		{key: types.NamespacedName{Namespace: "ns1", Name: "vm1.blue"}, network: "ns1_blue", ips: []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")}},
		{key: types.NamespacedName{Namespace: "ns2", Name: `vm\"3`}, network: "ns2_red", ips: []netip.Addr{netip.MustParseAddr("192.168.1.7")}},
		{key: types.NamespacedName{Namespace: "ns2", Name: "vm4.red"}, network: "ns2_red"},
	}
	// Byte by byte and in odd chunks: strings and escapes straddle reads.
	for name, r := range map[string]func() io.Reader{
		"whole":      func() io.Reader { return strings.NewReader(list) },
		"onebyte":    func() io.Reader { return iotest.OneByteReader(strings.NewReader(list)) },
		"halfreader": func() io.Reader { return iotest.HalfReader(strings.NewReader(list)) },
	} {
		got, meta, err := decodeAll(r())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if meta != (listMeta{resourceVersion: "4712", continueToken: "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"}) || !reflect.DeepEqual(normalize(got), want) {
			t.Fatalf("%s: got %+v meta %+v, want %+v", name, got, meta, want)
		}
	}
	got, _, err := decodeAll(strings.NewReader(listJSON()))
	if err != nil || len(got) != 0 {
		t.Fatalf("empty list: %v %v", got, err)
	}
}

func TestDecodeHeldClaimsRejects(t *testing.T) {
	for _, in := range []string{
		``,
		`null`,
		`{}`,
		`{"kind":"IPAMClaimList"}`, // no items: never "no claims"
		`{"kind":"Status","items":[]}`,
		`{"kind":"IPAMClaimList","items":[` + claimJSON("a", "b", "c", "10.0.0.1/8"), // truncated
		listJSON(claimJSON("a", "b", "c", "10.0.0.1/8"))[:300],
		`{"kind":"IPAMClaimList","items":[{"metadata":{"name":5}}]}`,
		`{"kind":"IPAMClaimList","items":[]} x`,
	} {
		if got, _, err := decodeAll(strings.NewReader(in)); err == nil {
			t.Errorf("%.80q: no error, got %v", in, got)
		}
	}
	if _, _, err := decodeAll(iotest.ErrReader(io.ErrClosedPipe)); err == nil {
		t.Error("read error not returned")
	}
}

func FuzzDecodeHeldClaims(f *testing.F) {
	f.Add([]byte(listJSON(claimJSON("ns1", "vm1.blue", "ns1_blue", "10.0.0.5/24"), claimJSON("ns1", "vm2", "n"))))
	f.Add([]byte(`{"kind":"IPAMClaimList","items":null,"metadata":{"resourceVersion":"1"}}`))
	f.Add([]byte(`{"kind":"IPAMClaimList","items":[{"metadata":{"name":"a\u0041\n","namespace":null},"status":{"ips":[null,"1.2.3.4/32"]}}]}`))
	f.Add([]byte(`{"kind":"IPAMClaimList","items":[{"status":{"ips":["1.2.3.4/32"]},"Status":{"x":1}}],"x":[1,{"a":"]"}]}`))
	f.Add([]byte(`{"kind":"IPAMClaimList","items":[{"stAtus":{"ips":["0000000000"]}},null,{"\u0073tatus":{"ips":["::1/128"]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, meta, err := decodeAll(bytes.NewReader(data))
		if !json.Valid(data) || !utf8.Valid(data) || duplicateKeys(data) {
			return // must not panic; lenient skipping of malformed input is fine
		}
		want, wantMeta, wantErr := referenceDecode(data)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("error %v, reference error %v", err, wantErr)
		}
		if err != nil {
			return
		}
		if meta != wantMeta || !reflect.DeepEqual(normalize(got), normalize(want)) {
			t.Fatalf("got %+v %+v, reference %+v %+v", got, meta, want, wantMeta)
		}
	})
}

func BenchmarkDecodeHeldClaims(b *testing.B) {
	items := make([]string, 10000)
	for i := range items {
		items[i] = claimJSON("restart-1795308032287698597", fmt.Sprintf("vm%d.net", i), "restart-1795308032287698597_net", fmt.Sprintf("10.1.%d.%d/8", i/256, i%256))
	}
	data := []byte(listJSON(items...))
	b.SetBytes(int64(len(data)))
	b.Run("scanner", func(b *testing.B) {
		for range b.N {
			if c, _, err := decodeAll(bytes.NewReader(data)); err != nil || len(c) != len(items) {
				b.Fatal(err, len(c))
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for range b.N {
			if c, _, err := referenceDecode(data); err != nil || len(c) != len(items) {
				b.Fatal(err, len(c))
			}
		}
	})
}
