package integration

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// TestHTTPResourceNamedByTheJob: two replicas of the "settle-orders" job
// with Redis leases, one started with a mistyped lease name, so that both
// hold "the" lease. They call an inventory service that checks tokens. As
// the README first showed (the resource keyed by l.Name()), the service
// keeps one order per lease name and accepts every call of both. Keyed by
// what the service protects and the job, spelled in code, both replicas'
// calls meet in one order: once the newer grant's token has been
// accepted, the older holder's calls are refused as stale.
func TestHTTPResourceNamedByTheJob(t *testing.T) {
	rc := redistest.Shared(t)
	prefix := redistest.Prefix(t)
	const job = "settle-orders"
	for _, tc := range []struct {
		name     string
		resource func(l *lease.Lease) string
		refused  bool
	}{
		{"by lease name", func(l *lease.Lease) string { return l.Name() }, false},
		{"by resource and job", func(*lease.Lease) string { return "inventory/" + job }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			b, err := redislease.New(rc, redislease.WithPrefix(prefix+tc.name+":"))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(&fencehttp.Handler{Checker: fencecheck.NewMemory(), Next: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})})
			defer srv.Close()
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			client := &http.Client{Transport: &fencehttp.Transport{Base: base, Require: true, Timeout: 10 * time.Second}}

			var leases []*lease.Lease
			for _, configured := range []string{"settle-orders", "settle_orders"} { // replica 2's configuration is mistyped
				m, err := lease.NewManager(b, 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				l, err := m.Acquire(ctx, configured)
				if err != nil {
					t.Fatalf("replica with lease name %q: %v", configured, err)
				}
				defer l.Release(context.Background())
				leases = append(leases, l)
				time.Sleep(2 * time.Millisecond) // the second grant is later
			}
			older, newer := leases[0], leases[1]
			if older.Token() >= newer.Token() {
				t.Fatalf("tokens %d then %d: Redis mints them from its clock, the later grant's should be greater", older.Token(), newer.Token())
			}
			call := func(l *lease.Lease) error {
				cctx := fencewire.NewContext(ctx, fencewire.Value{Resource: tc.resource(l), Token: l.Token()})
				req, _ := http.NewRequestWithContext(cctx, http.MethodPost, srv.URL, nil)
				resp, err := client.Do(req)
				if err == nil {
					_ = resp.Body.Close()
				}
				return err
			}
			accepted := map[*lease.Lease]int{}
			for range 6 {
				for _, l := range []*lease.Lease{newer, older} {
					err := call(l)
					switch _, stale := fence.AsStale(err); {
					case err == nil:
						accepted[l]++
					case !stale:
						t.Fatalf("call with lease %q: %v", l.Name(), err)
					}
				}
			}
			duplicated := accepted[older] > 0 && accepted[newer] > 0
			if tc.refused && (duplicated || accepted[newer] != 6) {
				t.Fatalf("keyed by resource and job: accepted %d of the newer holder's calls and %d of the older's; want 6 and 0", accepted[newer], accepted[older])
			}
			if !tc.refused && !duplicated {
				t.Fatalf("keyed by lease name: accepted %d and %d; the hazard this test documents did not show", accepted[newer], accepted[older])
			}
		})
	}
}
