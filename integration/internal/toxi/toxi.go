// Package toxi runs toxiproxy (github.com/Shopify/toxiproxy/v2) in the
// test process, for the integration tests' timed faults: latency, resets,
// blackholes in one direction, in force for a while. The faults a library
// module's tests inject (a lost reply, a held request, a blackhole) are
// in internal/testkit/faultnet, which needs only the standard library:
// toxiproxy stays out of the library modules' graphs.
package toxi

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// LeakIgnores are the goleak options a TestMain of a package that uses
// toxiproxy passes: the goroutines toxiproxy itself may leave behind,
// never fencekit's.
func LeakIgnores() []goleak.Option {
	return []goleak.Option{
		// A link's no-op stage stays blocked when a toxic is removed from
		// a link whose connection had closed meanwhile.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
		// The same race seen from the link's reader: it had read a chunk
		// from the client and blocks forever sending it to the stage that
		// was removed (CI, 2026-12-04, after the MariaDB history check).
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanWriter).Write"),
	}
}

// Proxy is a toxiproxy proxy in front of a server.
type Proxy struct {
	// Addr is host:port to connect to instead of the server.
	Addr string

	proxy *toxiproxy.Proxy
}

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// Start starts a proxy in front of upstream (host:port). When the test
// ends its toxics are removed and it stops.
func Start(t testing.TB, upstream string) *Proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "fk-"+nonName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy: start a proxy in front of %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	px := &Proxy{Addr: p.Listen, proxy: p}
	t.Cleanup(px.Reset)
	return px
}

// Add adds a toxic of kind (toxiproxy's type: latency, timeout,
// reset_peer...) on stream ("upstream": towards the server; "downstream":
// towards the client), with attrs (JSON members, `"latency":100`), and
// returns its name. It is removed by Remove, by Reset, or when the test
// ends, after the cleanups registered later (the clients' closing) have
// run. A latency toxic that still holds data when its connection closes
// blocks forever: a test that closes its clients first registers Reset as
// a cleanup of its own after making them.
func (p *Proxy) Add(kind, stream, attrs string) (string, error) {
	name := fmt.Sprintf("%s-%s-%d", kind, stream, time.Now().UnixNano())
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":{%s}}`, name, kind, stream, attrs)
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		return "", fmt.Errorf("toxiproxy: add %s: %w", kind, err)
	}
	return name, nil
}

// Remove removes the toxic name. It may be called from any goroutine.
func (p *Proxy) Remove(name string) error {
	return p.proxy.Toxics.RemoveToxic(context.Background(), name)
}

// Reset removes every toxic.
func (p *Proxy) Reset() { p.proxy.Toxics.ResetToxics(context.Background()) }

// For adds a toxic (see Add) and removes it after d, or when ctx ends.
func (p *Proxy) For(ctx context.Context, d time.Duration, kind, stream, attrs string) error {
	name, err := p.Add(kind, stream, attrs)
	if err != nil {
		return err
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	return p.Remove(name)
}
