package consensus

import (
	"context"
	"testing"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/rig/guarded"
	"github.com/fencekit/fencekit/internal/testkit"
)

// newResource creates one row in a throwaway PostgreSQL schema and names
// one object in the S3 bucket, both written only through the guards
// (package guarded), and removes them when the test ends. The services
// come from FENCE_POSTGRES_URL and FENCE_S3_* (./scripts/test.sh starts
// them).
func newResource(t *testing.T) guarded.Resource {
	t.Helper()
	if _, _, err := guarded.S3(); err != nil {
		t.Fatal(err)
	}
	r, drop, err := guarded.Create(testkit.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drop(context.Background()) })
	return r
}

// stored reads who wrote the row and the object last, and their tokens.
func stored(t *testing.T, r guarded.Resource) (rowBy string, rowTok fence.Token, objBy string, objTok fence.Token) {
	t.Helper()
	rowBy, rowTok, objBy, objTok, err := guarded.Stored(testkit.Context(t), r)
	if err != nil {
		t.Fatalf("read the row and the object: %v", err)
	}
	return rowBy, rowTok, objBy, objTok
}

// requireStale fails unless err is a stale-token rejection.
func requireStale(t *testing.T, what string, err error) {
	t.Helper()
	se, ok := fence.AsStale(err)
	if !ok {
		t.Fatalf("%s: want a stale-token rejection, got %v", what, err)
	}
	t.Logf("%s rejected: presented %d, the store had accepted %d", what, se.Presented, se.Current)
}
