package pglease_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/leasetest"
	"github.com/fencekit/fencekit/lease/pglease"
)

// shortTTL is the TTL of the checks that wait for expiry: every write
// commits (a WAL flush of the shared server, milliseconds on a loaded
// machine), so the suite's default of 200 ms leaves too little room for
// renewals on two shared cores.
const shortTTL = 500 * time.Millisecond

// Table mode on the shared server: each subtest its own schema, each
// connect its own pool.
func TestConformanceTable(t *testing.T) {
	url := testenv.PostgresURL()
	leasetest.Run(t, leasetest.Config{
		ShortTTL: shortTTL,
		NewStore: func(t *testing.T) func() lease.Backend {
			schema := newSchema(t, url)
			return func() lease.Backend {
				return newBackend(t, newPool(t, url), pglease.WithSchema(schema))
			}
		},
		LoseData: func(t *testing.T, b lease.Backend) {
			schema := b.(*pglease.Backend).Options().Schema
			exec(t, url, "TRUNCATE "+pgx.Identifier{schema, pglease.LeaseTable}.Sanitize())
		},
		Lacks: map[leasetest.Capability]string{
			leasetest.PushLoss: "table-mode grants are rows with an expiry, not sessions: nothing at the store ends them but expiry, release or data loss, which a renew finds",
		},
	})
}

// Session mode on the shared server.
func TestConformanceSession(t *testing.T) {
	url := testenv.PostgresURL()
	leasetest.Run(t, leasetest.Config{
		ShortTTL: shortTTL,
		NewStore: func(t *testing.T) func() lease.Backend {
			schema := newSchema(t, url)
			return func() lease.Backend {
				return newBackend(t, newPool(t, url), pglease.WithSchema(schema), pglease.WithMode(pglease.ModeSession))
			}
		},
		// What a restore from an older backup does: the sessions end and
		// the token table loses its rows.
		LoseData: func(t *testing.T, b lease.Backend) {
			pb := b.(*pglease.Backend)
			terminate(t, url, pb.PinnedPIDsForTest())
			exec(t, url, "TRUNCATE "+pgx.Identifier{pb.Options().Schema, pglease.SessionLeaseTable}.Sanitize())
		},
		EndSession: func(t *testing.T, b lease.Backend) {
			terminate(t, url, b.(*pglease.Backend).PinnedPIDsForTest())
		},
	})
}
