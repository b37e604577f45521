package redisfailover

import (
	"testing"

	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
)

// The scenario runs on a redistest.Deployment, as lease/redislease's
// failover tests do; the helpers that need no deployment are shared too:
// internal/testkit (NewManager, TryAcquire, RenewEvents, Span) and
// lease/redislease/redistest (UniquePrefix, StoredOwner).

func init() { redistest.SilenceLogger() }

func newBackend(t testing.TB, c redislease.Client, prefix string) *redislease.Backend {
	t.Helper()
	return testkit.Closed(redislease.New(c, redislease.WithPrefix(prefix)))(t)
}

// newShardedBackend is newBackend: New publishes with SPUBLISH and
// subscribes with SSUBSCRIBE where the server has them.
func newShardedBackend(t testing.TB, c redislease.Client, prefix string) *redislease.Backend {
	return newBackend(t, c, prefix)
}

// namesOn returns n lease names starting with base whose keys primary
// serves now.
func namesOn(t *testing.T, d redistest.Deployment, b *redislease.Backend, primary *redistest.Server, base string, n int) []string {
	t.Helper()
	return redistest.NamesOn(t, d, primary, base, n, func(name string) string { return b.KeysFor(name).Lease })
}
