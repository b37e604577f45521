// Command leaseholder is a lease holder process for the integration tests.
// It acquires one lease through lease.Manager over redislease (or, with
// -store postgres or postgres-session, over pglease in that mode) and reports
// what happens as JSON lines on its standard output (see Event). With
// -hold it keeps the lease, renewing it, until it is killed or the lease is
// lost; without it, it releases the lease at once and exits.
//
// Exit status: 0 after a release, 1 when the lease could not be acquired or
// was lost, 2 on bad flags.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/redislease"
)

// Event is one line of output.
type Event struct {
	At   time.Time `json:"at"`
	Pid  int       `json:"pid"`
	Kind string    `json:"kind"` // waiting, acquired, renewed, renew-failed, lost, released, failed
	// Token is the lease's token (acquired, renewed, lost, released).
	Token fence.Token `json:"token,omitempty"`
	// Sent is when the request that succeeded was sent: for acquired, the
	// send time of the granting request (Deadline - TTL + SafetyMargin);
	// for renewed, the renew request's.
	Sent time.Time `json:"sent,omitzero"`
	// Deadline is the lease's local deadline (acquired, renewed).
	Deadline time.Time `json:"deadline,omitzero"`
	Text     string    `json:"text,omitempty"`
}

type output struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *output) emit(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	e.Pid = os.Getpid()
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.enc.Encode(e)
}

// observer reports renewals.
type observer struct {
	lease.NopObserver
	out *output
	l   func() *lease.Lease
}

func (ob observer) Renewed(e lease.RenewedEvent) {
	if e.Err != nil {
		ob.out.emit(Event{Kind: "renew-failed", Token: e.Token, Sent: e.Sent, Text: e.Err.Error()})
		return
	}
	ev := Event{Kind: "renewed", Token: e.Token, Sent: e.Sent}
	if l := ob.l(); l != nil {
		ev.Deadline = l.Deadline()
	}
	ob.out.emit(ev)
}

func main() { os.Exit(run()) }

func run() int {
	var (
		url, prefix, name string
		store, pgURL      string
		schema            string
		ttl, timeout      time.Duration
		hold              bool
	)
	flag.StringVar(&store, "store", "redis", "lease store: redis, postgres (pglease table mode) or postgres-session (pglease session mode)")
	flag.StringVar(&url, "redis", "redis://127.0.0.1:6379/0", "Redis URL")
	flag.StringVar(&pgURL, "postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL (-store postgres*)")
	flag.StringVar(&schema, "schema", "", "schema of pglease's tables (-store postgres*)")
	flag.StringVar(&prefix, "prefix", "fencekit:", "redislease key prefix")
	flag.StringVar(&name, "name", "", "lease name (required)")
	flag.DurationVar(&ttl, "ttl", time.Second, "lease TTL")
	flag.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the lease")
	flag.BoolVar(&hold, "hold", false, "hold the lease until killed or lost, instead of releasing it at once")
	flag.Parse()
	out := &output{enc: json.NewEncoder(os.Stdout)}
	fail := func(format string, args ...any) int {
		out.emit(Event{Kind: "failed", Text: fmt.Sprintf(format, args...)})
		return 1
	}
	if name == "" {
		fmt.Fprintln(os.Stderr, "leaseholder: -name is required")
		return 2
	}
	var backend lease.Backend
	switch store {
	case "redis":
		opt, err := redis.ParseURL(url)
		if err != nil {
			return fail("redis URL: %v", err)
		}
		opt.ContextTimeoutEnabled = true
		rc := redis.NewClient(opt)
		defer rc.Close()
		b, err := redislease.New(rc, func(o *redislease.Options) { o.Prefix = prefix })
		if err != nil {
			return fail("%v", err)
		}
		defer b.Close()
		backend = b
	case "postgres", "postgres-session":
		pool, err := pgxpool.New(context.Background(), pgURL)
		if err != nil {
			return fail("postgres URL: %v", err)
		}
		defer pool.Close()
		mode := pglease.ModeTable
		if store == "postgres-session" {
			mode = pglease.ModeSession
		}
		b, err := pglease.New(pool, pglease.WithMode(mode), pglease.WithSchema(schema))
		if err != nil {
			return fail("%v", err)
		}
		defer b.Close()
		backend = b
	default:
		fmt.Fprintf(os.Stderr, "leaseholder: -store %q: want redis, postgres or postgres-session\n", store)
		return 2
	}

	var (
		mu  sync.Mutex
		cur *lease.Lease
	)
	ob := observer{out: out, l: func() *lease.Lease { mu.Lock(); defer mu.Unlock(); return cur }}
	m, err := lease.NewManager(backend, ttl, lease.WithIdentity(fmt.Sprintf("leaseholder-%d", os.Getpid())), lease.WithObserver(ob))
	if err != nil {
		return fail("%v", err)
	}
	out.emit(Event{Kind: "waiting", Text: "waiting for " + name})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	l, err := m.Acquire(ctx, name)
	cancel()
	if err != nil {
		return fail("acquire: %v", err)
	}
	mu.Lock()
	cur = l
	mu.Unlock()
	o := m.Options()
	out.emit(Event{Kind: "acquired", Token: l.Token(), Sent: l.Deadline().Add(-(o.TTL - o.SafetyMargin)), Deadline: l.Deadline()})
	if hold {
		<-l.Done()
		out.emit(Event{Kind: "lost", Token: l.Token(), Text: fmt.Sprint(l.Err())})
		return 1
	}
	if err := l.Release(context.Background()); err != nil {
		return fail("release: %v", err)
	}
	out.emit(Event{Kind: "released", Token: l.Token()})
	return 0
}
