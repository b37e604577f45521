// Command etcdholder is a lease holder process for the etcd backend's
// end-to-end tests (package consensus). It acquires one lease through
// lease.Manager over etcdlease, then follows commands read from its standard
// input, one a line, and reports what happens as JSON lines on its standard
// output (see Event):
//
//	check   reports whether the lease is still valid ("checked")
//	write   writes the fenced row and object with the lease's token
//	        ("write", one per store), without checking the lease first:
//	        a holder paused between its check and its write
//	exit    releases the lease (if still held) and exits
//
// Exit status: 0 after exit, 1 when the lease could not be acquired, 2 on
// bad flags.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/integration/consensus/internal/guarded"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/etcdlease"
)

// Event is one line of output.
type Event struct {
	At    time.Time   `json:"at"`
	Kind  string      `json:"kind"` // acquired, renewed, checked, write, lost, released, failed
	Token fence.Token `json:"token,omitempty"`
	// Sent is the send time of the request that succeeded (acquired,
	// renewed); Deadline the lease's local deadline then.
	Sent     time.Time       `json:"sent,omitzero"`
	Deadline time.Time       `json:"deadline,omitzero"`
	Valid    bool            `json:"valid,omitempty"` // checked
	Write    guarded.Outcome `json:"write,omitzero"`
	Text     string          `json:"text,omitempty"`
}

type output struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *output) emit(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.enc.Encode(e)
}

type observer struct {
	lease.NopObserver
	out *output
}

func (ob observer) Renewed(e lease.RenewedEvent) {
	if e.Err == nil {
		ob.out.emit(Event{Kind: "renewed", Token: e.Token, Sent: e.Sent})
	}
}

func main() { os.Exit(run()) }

func run() int {
	var (
		endpoints, prefix, name, res string
		ttl, minTTL                  time.Duration
	)
	flag.StringVar(&endpoints, "endpoints", "", "etcd endpoints, comma-separated (required)")
	flag.StringVar(&prefix, "prefix", "fencekit/", "etcdlease key prefix")
	flag.StringVar(&name, "name", "", "lease name (required)")
	flag.DurationVar(&ttl, "ttl", 2*time.Second, "lease TTL")
	flag.DurationVar(&minTTL, "min-ttl", time.Second, "the server's minimum TTL")
	flag.StringVar(&res, "resource", "", "the fenced resource, as JSON (guarded.Resource)")
	flag.Parse()
	out := &output{enc: json.NewEncoder(os.Stdout)}
	if endpoints == "" || name == "" || res == "" {
		fmt.Fprintln(os.Stderr, "etcdholder: -endpoints, -name and -resource are required")
		return 2
	}
	var r guarded.Resource
	if err := json.Unmarshal([]byte(res), &r); err != nil {
		fmt.Fprintf(os.Stderr, "etcdholder: -resource: %v\n", err)
		return 2
	}
	fail := func(format string, args ...any) int {
		out.emit(Event{Kind: "failed", Text: fmt.Sprintf(format, args...)})
		return 1
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fail("etcd client: %v", err)
	}
	defer cli.Close()
	b, err := etcdlease.New(cli, etcdlease.WithPrefix(prefix), etcdlease.WithMinTTL(minTTL))
	if err != nil {
		return fail("%v", err)
	}
	defer b.Close()
	m, err := lease.NewManager(b, ttl, lease.WithIdentity(fmt.Sprintf("etcdholder-%d", os.Getpid())), lease.WithObserver(observer{out: out}))
	if err != nil {
		return fail("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	l, err := m.Acquire(ctx, name)
	cancel()
	if err != nil {
		return fail("acquire: %v", err)
	}
	o := m.Options()
	out.emit(Event{Kind: "acquired", Token: l.Token(), Sent: l.Deadline().Add(-(l.TTL() - o.SafetyMargin)), Deadline: l.Deadline()})
	go func() {
		<-l.Done()
		if err := l.Err(); err != nil && err != lease.ErrReleased {
			out.emit(Event{Kind: "lost", Token: l.Token(), Text: err.Error()})
		}
	}()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch cmd := strings.TrimSpace(in.Text()); cmd {
		case "check":
			err := l.Err()
			e := Event{Kind: "checked", Token: l.Token(), Valid: err == nil, Deadline: l.Deadline()}
			if err != nil {
				e.Text = err.Error()
			}
			out.emit(e)
		case "write":
			wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			for _, w := range guarded.Write(wctx, r, "A", l.Token()) {
				out.emit(Event{Kind: "write", Token: l.Token(), Write: w})
			}
			cancel()
		case "exit":
			err := l.Release(context.Background())
			e := Event{Kind: "released", Token: l.Token()}
			if err != nil {
				e.Text = err.Error()
			}
			out.emit(e)
			return 0
		default:
			out.emit(Event{Kind: "failed", Text: "unknown command " + cmd})
		}
	}
	return 0
}
