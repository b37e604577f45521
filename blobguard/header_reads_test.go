package blobguard_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// readModes are the two ways a guard reads an object before writing over
// it. Tests of write behaviour run in both.
var readModes = []struct {
	name string
	opt  blobguard.Option
}{
	{"full", nil},
	{"header", blobguard.WithHeaderReads()},
}

// headerReads reports whether mode turns Options.HeaderReads on.
func headerReads(mode blobguard.Option) bool {
	var o blobguard.Options
	if mode != nil {
		mode(&o)
	}
	return o.HeaderReads
}

// forEachReadMode runs test in parallel subtests, once per read mode.
func forEachReadMode(t *testing.T, test func(t *testing.T, mode blobguard.Option)) {
	t.Parallel()
	for _, m := range readModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			test(t, m.opt)
		})
	}
}

// TestHeaderReadPairing checks, on the real server, the property that
// Options.HeaderReads rests on: while one writer keeps replacing an
// object, a ranged GetObject of its header never returns an ETag together
// with a header older than the write that ETag names. HeadObject is
// measured alongside: it can pair an older write's metadata token with a
// newer ETag (the pairing that would let a stale write through), which is
// why the guard never uses it; that count is logged, not asserted (it
// depends on timing).
func TestHeaderReadPairing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	raw := rawClient(baseTransport)
	g := newGuard(t, raw)
	key := uniqueKey(t, "obj")
	body := bytes.Repeat([]byte("x"), 256<<10) // long enough to publish that reads overlap it

	var tokenOf sync.Map // normalised ETag -> token, from each write's acknowledgement
	record := func(v blobguard.Version) { tokenOf.Store(strings.Trim(v.ETag(), `"`), v.Token()) }
	v, err := g.Put(ctx, key, 1, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	record(v)

	type pair struct {
		etag  string
		token fence.Token
	}
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		observed = map[string][]pair{}
	)
	wg.Go(func() {
		for tok := fence.Token(2); !stop.Load(); tok++ {
			nv, err := g.PutIf(ctx, key, tok, bytes.NewReader(body), v)
			if err != nil {
				t.Errorf("writer: %v", err)
				return
			}
			v = nv
			record(v)
		}
	})
	read := map[string]func() (string, fence.Token, error){
		"ranged GetObject": func() (string, fence.Token, error) {
			out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key), Range: aws.String("bytes=0-29")})
			if err != nil {
				return "", 0, err
			}
			defer out.Body.Close()
			var h [blobguard.HeaderSize]byte
			if _, err := io.ReadFull(out.Body, h[:]); err != nil {
				return "", 0, err
			}
			return aws.ToString(out.ETag), fence.Token(binary.BigEndian.Uint64(h[6:14])), nil
		},
		"HeadObject": func() (string, fence.Token, error) {
			out, err := raw.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key)})
			if err != nil {
				return "", 0, err
			}
			n, err := strconv.ParseUint(out.Metadata[blobguard.MetaToken], 10, 64)
			return aws.ToString(out.ETag), fence.Token(n), err
		},
	}
	for name, fn := range read {
		wg.Go(func() {
			for !stop.Load() {
				etag, tok, err := fn()
				if err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				mu.Lock()
				observed[name] = append(observed[name], pair{strings.Trim(etag, `"`), tok})
				mu.Unlock()
			}
		})
	}
	// Read until each way has read enough to race many writes: by count,
	// not by time, so that a loaded machine reads as much, more slowly.
	const enough = 150
	for limit := time.Now().Add(time.Minute); time.Now().Before(limit); {
		mu.Lock()
		done := len(observed["ranged GetObject"]) >= enough && len(observed["HeadObject"]) >= enough
		mu.Unlock()
		if done {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()

	for name, pairs := range observed {
		var older, newer int
		for _, p := range pairs {
			want, ok := tokenOf.Load(p.etag)
			if !ok {
				t.Errorf("%s returned ETag %s, which no write was acknowledged with", name, p.etag)
				continue
			}
			switch {
			case p.token < want.(fence.Token):
				older++
			case p.token > want.(fence.Token):
				newer++
			}
		}
		t.Logf("%s: %d reads; token older than the ETag's write: %d; newer: %d", name, len(pairs), older, newer)
		if name == "ranged GetObject" {
			if len(pairs) < 100 {
				t.Errorf("%s: only %d reads", name, len(pairs))
			}
			if older > 0 {
				t.Errorf("%s paired an ETag with an older header %d times: Options.HeaderReads is not safe on this store", name, older)
			}
		}
	}
}

// headerCountingTransport records the GETs a guard sends: how many, how
// many asked for a range, and how many body bytes came back.
type headerCountingTransport struct {
	next                 http.RoundTripper
	gets, ranged, nbytes atomic.Int64
}

func (c *headerCountingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if req.Method == http.MethodGet && err == nil {
		c.gets.Add(1)
		if req.Header.Get("Range") != "" {
			c.ranged.Add(1)
		}
		if resp.ContentLength > 0 {
			c.nbytes.Add(resp.ContentLength)
		}
	}
	return resp, err
}

// TestHeaderReadsCost: with HeaderReads, a cold Put over a 1 MiB object
// reads the header only (one ranged GET of HeaderSize bytes), and Delete
// likewise; without it, it reads the whole object.
func TestHeaderReadsCost(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	big := bytes.Repeat([]byte("b"), 1<<20)
	for _, m := range readModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			ct := &headerCountingTransport{next: newTransport(t)}
			g := newGuard(t, rawClient(ct), m.opt)
			key := uniqueKey(t, "obj")
			if _, err := g.Put(ctx, key, 1, bytes.NewReader(big)); err != nil {
				t.Fatal(err)
			}
			ct.gets.Store(0)
			ct.ranged.Store(0)
			ct.nbytes.Store(0)
			if _, err := g.Put(ctx, key, 2, bytes.NewReader(big)); err != nil {
				t.Fatal(err)
			}
			if _, err := g.Delete(ctx, key, 3); err != nil {
				t.Fatal(err)
			}
			gets, ranged, n := ct.gets.Load(), ct.ranged.Load(), ct.nbytes.Load()
			switch m.name {
			case "header":
				if gets != 2 || ranged != 2 || n != 2*blobguard.HeaderSize {
					t.Fatalf("cold Put + Delete: %d GETs, %d ranged, %d bytes read; want 2, 2, %d", gets, ranged, n, 2*blobguard.HeaderSize)
				}
			default:
				if gets != 2 || ranged != 0 || n != 2*int64(blobguard.HeaderSize+len(big)) {
					t.Fatalf("cold Put + Delete: %d GETs, %d ranged, %d bytes read; want 2, 0, %d", gets, ranged, n, 2*(blobguard.HeaderSize+len(big)))
				}
			}
			_, err := g.Get(ctx, key)
			if tomb, ok := blobguard.TombstoneOf(err); !ok || tomb.Token() != 3 {
				t.Fatalf("Get after Delete: %v; want the tombstone of token 3", err)
			}
		})
	}
}

// TestHeaderReadsLargeStoredObject: MaxObjectSize bounds what a guard
// holds in memory. Reading the whole object before a write holds the
// stored object too, so a Put over a larger one is refused; reading the
// header does not, so it succeeds.
func TestHeaderReadsLargeStoredObject(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	key := uniqueKey(t, "obj")
	if _, err := newGuard(t, rawClient(baseTransport)).Put(ctx, key, 1, bytes.NewReader(make([]byte, 4096))); err != nil {
		t.Fatal(err)
	}
	for _, m := range readModes {
		g := newGuard(t, rawClient(baseTransport), m.opt, blobguard.WithMaxObjectSize(1024))
		_, err := g.Put(ctx, key, 2, strings.NewReader("small"))
		switch m.name {
		case "header":
			if err != nil {
				t.Fatalf("%s reads: Put over a 4 KiB object: %v; want success", m.name, err)
			}
		default:
			if !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("%s reads: Put over a 4 KiB object: %v; want ErrInvalidInput (over MaxObjectSize)", m.name, err)
			}
		}
	}
	wantStored(t, newGuard(t, rawClient(baseTransport)), key, 2, "small")
}
