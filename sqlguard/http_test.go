package sqlguard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit/faultnet"
	"github.com/fencekit/fencekit/sqlguard"
)

// TestConformanceOverHTTP runs the guard conformance suite through a
// downstream HTTP service: the writer's token travels in the Fencing-Token
// field (fencehttp.Transport), the service's middleware puts it into the
// handler's context, and the handler's fenced transaction
// (Guard.BeginFunc) presents it unchanged; a stale rejection comes back
// to the writer as the same *fence.StaleError, and a reply lost after the
// commit as fence.ErrOutcomeUnknown. The server is a real HTTP server on
// loopback.
func TestConformanceOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE http_values (resource text PRIMARY KEY, value text NOT NULL)`)
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	// Requests that reached the service, by the resource their header
	// names: the suite's subtests run side by side, each on a resource of
	// its own. A request without a well-formed header (a token 0 would
	// not be) counts as "", against every resource.
	var requests sync.Map // resource name -> *atomic.Int64
	counter := func(name string) *atomic.Int64 {
		c, _ := requests.LoadOrStore(name, new(atomic.Int64))
		return c.(*atomic.Int64)
	}
	var lose sync.Map // resource names whose next reply is lost
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, _ := fencewire.FromContext(r.Context())
		tok, _ := fence.FromContext(r.Context())
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		err = g.BeginFunc(r.Context(), e.Pool, v.Resource, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), `INSERT INTO http_values (resource, value) VALUES ($1, $2)
				ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value`, v.Resource, string(body))
			return err
		})
		if err != nil && !fencehttp.WriteError(w, err) {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	guarded := &fencehttp.Handler{Require: true, Next: write}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, _ := fencewire.Peek(r.Header.Values(fencewire.HeaderName))
		counter(v.Resource).Add(1)
		guarded.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	t.Cleanup(tr.CloseIdleConnections)
	// The service handles the request; its reply is lost on the way back.
	base := &faultnet.ReplyLoser{Next: tr, Lose: func(r *http.Request) bool {
		v, _ := fencewire.Peek(r.Header.Values(fencewire.HeaderName))
		_, armed := lose.LoadAndDelete(v.Resource)
		return armed
	}}
	client := &http.Client{Transport: &fencehttp.Transport{Base: base, Require: true}}
	var n atomic.Int64
	guardtest.Run(t, guardtest.Config{
		NewResource: func(t *testing.T) guardtest.Resource {
			return &httpResource{e: e, url: srv.URL, client: client, name: fmt.Sprintf("http/%d 'x' é", n.Add(1))}
		},
		// Bad input never reaches the service: the Transport refuses
		// token 0 before sending.
		CountIO: func(r guardtest.Resource) int64 {
			return counter(r.(*httpResource).name).Load() + counter("").Load()
		},
		// The service commits, then its reply is lost: the writer's
		// Transport reports an unknown outcome.
		LoseReply: func(t *testing.T, r guardtest.Resource) { lose.Store(r.(*httpResource).name, true) },
		// The writer's Transport reports each call.
		Observe: func(t *testing.T, r guardtest.Resource, o fence.WriteObserver) guardtest.Want {
			h := r.(*httpResource)
			h.client = &http.Client{Transport: &fencehttp.Transport{Base: base, Require: true, Observer: o}}
			return guardtest.Want{Guard: "fencehttp", Class: srv.Listener.Addr().String(), Op: "call", Resource: h.name}
		},
		Lacks: map[guardtest.Capability]string{
			guardtest.Missing: "a resource name needs no creating: no target is missing",
			guardtest.Setup:   "the transport keeps nothing: the service's own guard checks its store (TestConformanceBeginFunc)",
		},
	})
}

type httpResource struct {
	e      *env
	url    string
	client *http.Client
	name   string
}

func (r *httpResource) Write(ctx context.Context, token fence.Token, value string) error {
	req, err := http.NewRequestWithContext(fencewire.NewContext(ctx, fencewire.Value{Resource: r.name, Token: token}),
		http.MethodPut, r.url, strings.NewReader(value))
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("PUT: %s: %s", resp.Status, b)
	}
	return nil
}

func (r *httpResource) Read(ctx context.Context) (string, fence.Token, error) {
	var v string
	var tok int64
	err := r.e.Pool.QueryRow(ctx, `SELECT
		coalesce((SELECT value FROM http_values WHERE resource = $1), ''),
		coalesce((SELECT token FROM fencekit_resource_tokens WHERE resource = $1), 0)`, r.name).Scan(&v, &tok)
	return v, fence.Token(tok), err
}

// A valid token above what the Checker stores (a bigint: 2^63 and up)
// reaches the caller as out of the receiver's range (422), distinct from
// a malformed field, and the handler does not run: over a real HTTP
// server, the caller's Transport reports fencecheck.ErrTokenRange.
func TestCheckerTokenBeyondBigintOverHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := sqlguard.NewChecker(e.Pool)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	srv := httptest.NewServer(&fencehttp.Handler{Checker: c, Next: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled.Add(1) })})
	t.Cleanup(srv.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	for _, tok := range []fence.Token{1 << 63, 1<<64 - 1} {
		v := fencewire.Value{Resource: "inventory/settle-orders", Token: tok}
		field, err := fencewire.Format(v)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, nil)
		req.Header.Set(fencewire.HeaderName, field)
		resp, err := (&http.Client{Transport: base}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(body), fencewire.ProblemTokenRange) {
			t.Fatalf("token %d: %s %s; want 422 and %s", tok, resp.Status, body, fencewire.ProblemTokenRange)
		}

		req, _ = http.NewRequestWithContext(fencewire.NewContext(t.Context(), v), http.MethodPost, srv.URL, nil)
		_, err = (&http.Client{Transport: &fencehttp.Transport{Base: base}}).Do(req)
		if !errors.Is(err, fencecheck.ErrTokenRange) || !errors.Is(err, fencewire.ErrRejected) || errors.Is(err, fencewire.ErrMalformed) || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Fatalf("token %d through fencehttp.Transport = %v; want fencecheck.ErrTokenRange", tok, err)
		}
	}
	if n := handled.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
	if got, err := c.Current(t.Context(), "inventory/settle-orders"); err != nil || got != fence.None {
		t.Fatalf("the refused tokens left %d, %v", got, err)
	}
}
