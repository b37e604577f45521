package redischeck_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencecheck/checktest"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
	"github.com/fencekit/fencekit/redischeck"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newChecker(t *testing.T, c redis.Scripter) *redischeck.Checker { return newCheckerTB(t, c) }

func newCheckerTB(t testing.TB, c redis.Scripter) *redischeck.Checker {
	t.Helper()
	chk, err := redischeck.New(c, redischeck.WithKeyPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	return chk
}

func TestConformance(t *testing.T) {
	rdb := redistest.Shared(t)
	checktest.Run(t, checktest.Config{
		New: func(t *testing.T) (fencecheck.Checker, func(context.Context, string) (fence.Token, error)) {
			c := newChecker(t, rdb)
			return c, c.Current
		},
		Checkers: 6, ChecksPerChecker: 60,
	})
}

// Tokens above 2^53 differ in their last digits; a script that compared
// them as Lua numbers (doubles) would call them equal.
func TestTokensAbove2To53CompareExactly(t *testing.T) {
	c := newChecker(t, redistest.Shared(t))
	ctx := t.Context()
	top := fence.Token(math.MaxUint64)
	if err := c.Check(ctx, "r", top); err != nil {
		t.Fatal(err)
	}
	err := c.Check(ctx, "r", top-1)
	if se, ok := fence.AsStale(err); !ok || se.Presented != top-1 || se.Current != top {
		t.Fatalf("Check(2^64-2) after 2^64-1 = %v; want stale naming both", err)
	}
	if err := c.Check(ctx, "s", 1<<53+1); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(ctx, "s", 1<<53); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Check(2^53) after 2^53+1 = %v; want stale", err)
	}
	// A shorter token is older whatever its digits: "9" < "10".
	if err := c.Check(ctx, "u", 10); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(ctx, "u", 9); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Check(9) after 10 = %v; want stale", err)
	}
}

func TestCorruptKeyIsRefused(t *testing.T) {
	rdb := redistest.Shared(t)
	c := newChecker(t, rdb)
	ctx := t.Context()
	for name, set := range map[string]func(key string) error{
		"not digits": func(k string) error { return rdb.Set(ctx, k, "x12", 0).Err() },
		"leading 0":  func(k string) error { return rdb.Set(ctx, k, "012", 0).Err() },
		"a hash":     func(k string) error { return rdb.HSet(ctx, k, "f", "1").Err() },
	} {
		if err := set(c.Key(name)); err != nil {
			t.Fatal(err)
		}
		err := c.Check(ctx, name, 5)
		if err == nil || errors.Is(err, fence.ErrStaleToken) || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Errorf("%s: Check = %v; want a plain error", name, err)
		}
		if name != "a hash" && !errors.Is(err, redischeck.ErrCorrupt) {
			t.Errorf("%s: Check = %v; want ErrCorrupt", name, err)
		}
		if _, err := c.Current(ctx, name); err == nil {
			t.Errorf("%s: Current read a token", name)
		}
	}
}

// A check whose reply is lost after the server ran its script (the
// connection breaks then; the client does not resend) is an unknown
// outcome, and the script did run.
func TestLostReplyIsUnknown(t *testing.T) {
	rdb := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	plain, _ := redischeck.New(rdb, redischeck.WithKeyPrefix(prefix))
	// The script is loaded now, so that the faulted call runs it.
	if err := plain.Check(t.Context(), "warm", 1); err != nil {
		t.Fatal(err)
	}
	w := &faultnet.Wire{Request: func(b []byte) bool { return bytes.Contains(bytes.ToLower(b), []byte("eval")) }}
	opt := *rdb.Options()
	opt.Dialer, opt.MaxRetries = w.Dial, -1
	lossy := redis.NewClient(&opt)
	t.Cleanup(func() { _ = lossy.Close() })
	c, err := redischeck.New(lossy, redischeck.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	w.Arm()
	err = c.Check(t.Context(), "r", 7)
	if w.Cuts() != 1 {
		t.Fatalf("%d replies lost, want 1: the test proves nothing", w.Cuts())
	}
	if !errors.Is(err, fence.ErrOutcomeUnknown) || errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("Check with its reply lost = %v; want fence.ErrOutcomeUnknown", err)
	}
	if got, err := plain.Current(t.Context(), "r"); err != nil || got != 7 {
		t.Fatalf("the store holds %d, %v; want 7", got, err)
	}
}

func TestRefusedConnectionIsPlain(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rdb.Close()
	c, _ := redischeck.New(rdb)
	err = c.Check(t.Context(), "r", 1)
	if err == nil || errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("Check on a closed port = %v; want a plain error (nothing was sent)", err)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	if _, err := redischeck.New(nil, redischeck.WithKeyPrefix("")); !errors.Is(err, redischeck.ErrInvalid) {
		t.Fatalf("New(nil, empty prefix) = %v; want ErrInvalid", err)
	}
}
