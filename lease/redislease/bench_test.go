package redislease

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// BenchmarkCycle compares, in one run on the same Redis, a TryAcquire+Release
// cycle of the lease Manager with its floor: the same two scripts sent
// directly through go-redis (EVALSHA), and plain SET NX PX + DEL.
//
//	go test -run '^$' -bench 'Cycle|Renew' -count 6 ./lease/redislease/ | tee bench.txt
//	benchstat -col /impl bench.txt
func BenchmarkCycle(b *testing.B) {
	ctx := context.Background()
	c := redistest.Shared(b)
	prefix := redistest.Prefix(b)
	be, err := New(c, func(o *Options) { o.Prefix = prefix })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	m, err := lease.NewManager(be, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	keys := be.KeysFor("cycle")
	ttlMs := int64(10000)

	b.Run("impl=fencekit", func(b *testing.B) {
		for b.Loop() {
			l, err := m.TryAcquire(ctx, "cycle")
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=raw-scripts", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			owner := fmt.Sprintf("raw-%d", i)
			ended := be.endedKey("cycle", owner)
			tok, err := acquireScript.Run(ctx, c, []string{keys.Lease, keys.Token, ended}, owner, ttlMs).Int64()
			if err != nil {
				b.Fatal(err)
			}
			if err := be.release.Run(ctx, c, []string{keys.Lease, ended}, strconv.FormatInt(tok, 10)+":"+owner, keys.Channel, endedMillis(10*time.Second)).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=raw-set-del", func(b *testing.B) {
		for b.Loop() {
			if err := c.SetNX(ctx, keys.Lease+"-plain", "owner", 10*time.Second).Err(); err != nil {
				b.Fatal(err)
			}
			if err := c.Del(ctx, keys.Lease+"-plain").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRenew compares Lease.Renew with the renew script sent directly.
func BenchmarkRenew(b *testing.B) {
	ctx := context.Background()
	c := redistest.Shared(b)
	prefix := redistest.Prefix(b)
	be, err := New(c, func(o *Options) { o.Prefix = prefix })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	m, err := lease.NewManager(be, 10*time.Second, lease.WithoutAutoRenew())
	if err != nil {
		b.Fatal(err)
	}
	l, err := m.TryAcquire(ctx, "renew")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Release(ctx)
	b.Run("impl=fencekit", func(b *testing.B) {
		for b.Loop() {
			if err := l.Renew(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=raw-scripts", func(b *testing.B) {
		for b.Loop() {
			if err := renewScript.Run(ctx, c, []string{be.KeysFor("renew").Lease}, l.Token().String()+":"+l.Owner(), int64(10000)).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
