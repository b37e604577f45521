// Package testkit is the test equipment every module's tests share: small
// helpers that need nothing but the standard library and the core module
// (package lease). It is a module of its own that only tests, benchmarks,
// examples and the integration suites import; library code never does.
//
// Helpers that need a store's client stay with that store's harness
// (internal/pgtest, redistest, etcdtest, zktest, dynamotest), so that a
// backend's test module graph never pulls in another store's client.
// Package testenv, beside this one, tells where the services are.
package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
)

// Timeout bounds the context of Context: long enough for a test against a
// real store on a loaded machine, short enough that a hung test fails
// with a deadline instead of the test binary's timeout.
const Timeout = time.Minute

// Context returns a context cancelled when tb ends or after Timeout,
// whichever comes first.
func Context(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	tb.Cleanup(cancel)
	return ctx
}

// NewManager returns lease.NewManager(b, ttl, opts...), failing tb on an
// error.
func NewManager(tb testing.TB, b lease.Backend, ttl time.Duration, opts ...lease.Option) *lease.Manager {
	tb.Helper()
	m, err := lease.NewManager(b, ttl, opts...)
	if err != nil {
		tb.Fatalf("lease.NewManager: %v", err)
	}
	return m
}

// RandHex returns n random bytes in hexadecimal (2n characters), for names
// that must not collide between runs: key prefixes, schemas, tables.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}

// GrantSent is the send time of the request that granted l, as m's
// options place it: l's first deadline is that plus TTL - SafetyMargin.
func GrantSent(m *lease.Manager, l *lease.Lease) time.Time {
	return l.Deadline().Add(-(l.TTL() - m.Options().SafetyMargin))
}

// RenewLog is a lease.Observer that records, for each token, the send time
// of the last request the store confirmed: a renewal, or the acquire (set
// by the test with Confirmed and GrantSent).
type RenewLog struct {
	lease.NopObserver
	mu   sync.Mutex
	sent map[fence.Token]time.Time
}

// NewRenewLog returns an empty RenewLog.
func NewRenewLog() *RenewLog { return &RenewLog{sent: map[fence.Token]time.Time{}} }

// Renewed records a confirmed renewal.
func (r *RenewLog) Renewed(e lease.RenewedEvent) {
	if e.Err == nil {
		r.Confirmed(e.Token, e.Sent)
	}
}

// Confirmed records that a request for tok sent at sent was confirmed;
// an earlier one than already recorded changes nothing.
func (r *RenewLog) Confirmed(tok fence.Token, sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sent.After(r.sent[tok]) {
		r.sent[tok] = sent
	}
}

// Last returns the send time of the last confirmed request for tok (zero
// when there was none).
func (r *RenewLog) Last(tok fence.Token) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent[tok]
}
