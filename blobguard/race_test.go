package blobguard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

const (
	raceWriters = 8
	raceRounds  = 12
)

type putResult struct {
	token fence.Token
	err   error
}

// roundTokens returns the distinct tokens of round r, shuffled: each round's
// tokens are above every earlier round's.
func roundTokens(r int) []fence.Token {
	toks := make([]fence.Token, raceWriters)
	for i := range toks {
		toks[i] = fence.Token(r*raceWriters + i + 1)
	}
	rand.Shuffle(len(toks), func(i, j int) { toks[i], toks[j] = toks[j], toks[i] })
	return toks
}

// runRound starts one goroutine per token at once and collects the results.
func runRound(tokens []fence.Token, write func(i int, tok fence.Token) error) []putResult {
	start := make(chan struct{})
	res := make([]putResult, len(tokens))
	var wg sync.WaitGroup
	for i, tok := range tokens {
		wg.Go(func() {
			<-start
			res[i] = putResult{tok, write(i, tok)}
		})
	}
	close(start)
	wg.Wait()
	return res
}

// checkRound checks that every writer either won or was refused as stale
// with a newer stored token, and that the stored object is the one of the
// highest token among the winners.
func checkRound(t *testing.T, g *blobguard.Guard, key string, r int, res []putResult, bodyOf func(fence.Token) string) {
	t.Helper()
	var best fence.Token
	for _, pr := range res {
		switch se, ok := fence.AsStale(pr.err); {
		case pr.err == nil:
			best = max(best, pr.token)
		case ok:
			if se.Current <= pr.token {
				t.Errorf("round %d: token %d refused as stale with current %d", r, pr.token, se.Current)
			}
		default:
			t.Errorf("round %d: token %d: %v", r, pr.token, pr.err)
		}
	}
	roundMax := fence.Token((r + 1) * raceWriters)
	if best != roundMax {
		t.Errorf("round %d: highest winning token %d; want %d (no writer holds a newer one, so it cannot lose)", r, best, roundMax)
	}
	obj, err := g.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("round %d: Get: %v", r, err)
	}
	if obj.Token() != best || string(obj.Body) != bodyOf(best) {
		t.Errorf("round %d: stored token %d body %q; want token %d body %q", r, obj.Token(), obj.Body, best, bodyOf(best))
	}
}

// guards returns one guard per writer over one client, as separate holders
// would have.
func guards(t *testing.T, client blobguard.Client, mode blobguard.Option) []*blobguard.Guard {
	gs := make([]*blobguard.Guard, raceWriters)
	for i := range gs {
		gs[i] = newGuard(t, client, mode, blobguard.WithMaxAttempts(2*raceWriters))
	}
	return gs
}

// TestRaceDistinctTokens: many writers with distinct tokens put the same key
// at once, round after round. The stored token never decreases (watched by a
// reader throughout) and each round ends with the object of its highest
// token.
func TestRaceDistinctTokens(t *testing.T) { forEachReadMode(t, testRaceDistinctTokens) }

func testRaceDistinctTokens(t *testing.T, mode blobguard.Option) {
	client := rawClient(baseTransport)
	gs := guards(t, client, mode)
	key := uniqueKey(t, "obj")
	bodyOf := func(tok fence.Token) string { return fmt.Sprintf("written with token %d", tok) }

	obs := observe(t.Context(), newGuard(t, client), key)
	for r := range raceRounds {
		res := runRound(roundTokens(r), func(i int, tok fence.Token) error {
			_, err := gs[i].Put(t.Context(), key, tok, strings.NewReader(bodyOf(tok)))
			return err
		})
		checkRound(t, gs[0], key, r, res, bodyOf)
	}
	obs.finish(t)
}

// TestIdenticalBytesShareETag shows the trap on the real server: two plain
// writes of the same bytes get the same ETag, so If-Match cannot tell them
// apart. The guard's writes of the same bytes get different ETags.
func TestIdenticalBytesShareETag(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	raw := rawClient(baseTransport)
	key := uniqueKey(t, "plain")
	var etags []string
	for range 2 {
		out, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(s3env.Bucket), Key: aws.String(key), Body: strings.NewReader("same bytes")})
		if err != nil {
			t.Fatal(err)
		}
		etags = append(etags, aws.ToString(out.ETag))
	}
	if etags[0] != etags[1] {
		t.Fatalf("plain writes of identical bytes got ETags %v; the trap this guard defends against is absent here", etags)
	}
	// So a holder of the first write's ETag can replace the second write,
	// whatever token the second one recorded in its metadata.
	if _, err := raw.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(s3env.Bucket), Key: aws.String(key), Body: strings.NewReader("stale"),
		IfMatch: aws.String(etags[0]),
	}); err != nil {
		t.Fatalf("If-Match with the first write's ETag over the second write: %v; want success (the trap)", err)
	}

	g := newGuard(t, raw)
	fkey := uniqueKey(t, "fenced")
	v1, err := g.Put(ctx, fkey, 1, strings.NewReader("same bytes"))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := g.Put(ctx, fkey, 1, strings.NewReader("same bytes"))
	if err != nil {
		t.Fatal(err)
	}
	if v1.ETag() == v2.ETag() {
		t.Fatalf("two fenced writes of identical bytes share ETag %s", v1.ETag())
	}
}

// TestIdenticalBytesStaleHolder is the trap played out: a holder read
// version v (token 5, bytes B); a newer holder (token 7) then wrote the same
// bytes B. With If-Match on v's ETag alone, the stale holder (token 6)
// would win, as both objects hash alike. It must be refused.
func TestIdenticalBytesStaleHolder(t *testing.T) { forEachReadMode(t, testIdenticalBytesStaleHolder) }

func testIdenticalBytesStaleHolder(t *testing.T, mode blobguard.Option) {
	ctx := t.Context()
	g := newGuard(t, rawClient(baseTransport), mode)
	key := uniqueKey(t, "obj")
	const same = "identical bytes"

	v, err := g.Put(ctx, key, 5, strings.NewReader(same))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Put(ctx, key, 7, strings.NewReader(same)); err != nil {
		t.Fatal(err)
	}
	_, err = g.PutIf(ctx, key, 6, strings.NewReader(same), v)
	wantStale(t, err, 6, 7)
	_, err = g.PutIf(ctx, key, 6, strings.NewReader("different"), v)
	wantStale(t, err, 6, 7)
	_, err = g.Put(ctx, key, 6, strings.NewReader(same))
	wantStale(t, err, 6, 7)
	wantStored(t, g, key, 7, same)
}

// TestRaceIdenticalBytes: writers with distinct tokens write the same bytes
// at once by read-modify-write, each starting from a version read before
// the round began (so all hold the same, soon outdated, ETag, and every
// object of the round hashes alike without the guard's header). The stored
// token never decreases, and each round ends at its highest token.
func TestRaceIdenticalBytes(t *testing.T) { forEachReadMode(t, testRaceIdenticalBytes) }

func testRaceIdenticalBytes(t *testing.T, mode blobguard.Option) {
	client := rawClient(baseTransport)
	gs := guards(t, client, mode)
	key := uniqueKey(t, "obj")
	const same = "every writer writes these bytes"
	bodyOf := func(fence.Token) string { return same }

	obs := observe(t.Context(), newGuard(t, client), key)
	for r := range raceRounds {
		var prev blobguard.Version
		switch obj, err := gs[0].Get(t.Context(), key); {
		case err == nil:
			prev = obj.Version
		case !errors.Is(err, fence.ErrNotFound):
			t.Fatal(err)
		}
		res := runRound(roundTokens(r), func(i int, tok fence.Token) error {
			return rmwLoop(t.Context(), gs[i], key, tok, same, prev)
		})
		checkRound(t, gs[0], key, r, res, bodyOf)
	}
	obs.finish(t)
}

// rmwLoop writes body with PutIf from prev, re-reading after a conflict.
func rmwLoop(ctx context.Context, g *blobguard.Guard, key string, tok fence.Token, body string, prev blobguard.Version) error {
	for range 4 * raceWriters {
		_, err := g.PutIf(ctx, key, tok, strings.NewReader(body), prev)
		if !errors.Is(err, blobguard.ErrConflict) {
			return err
		}
		obj, err := g.Get(ctx, key)
		if err != nil {
			return err
		}
		prev = obj.Version
		time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond)
	}
	return errors.New("rmwLoop: too many conflicts")
}
