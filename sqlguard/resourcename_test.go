package sqlguard_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/sqlguard"
)

// TestResourceNameUnderClientEncodingSJIS: a resource name is a value and
// reaches the server byte for byte, whatever the session's client_encoding.
// Under SJIS, whose two-byte characters can end in the byte of a
// backslash, and with backslash_quote = on, a name built to close a quoted
// literal early must neither run SQL nor advance some other resource.
func TestResourceNameUnderClientEncodingSJIS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.exec(t, `CREATE TABLE canary (id int)`)
	var w wire
	conn := e.wireConnect(t, &w, nil)
	for _, set := range []string{`SET client_encoding = 'SJIS'`, `SET backslash_quote = on`} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatalf("%s: %v", set, err)
		}
	}
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	// U+00C1 is C3 81 in UTF-8; in SJIS, C3 is one character and 81 5C
	// another, which eats the first of two escaped backslashes.
	const crafted = "\u00c1\\'::text, 100::bigint); DROP TABLE canary; --"
	if err := g.BeginFunc(ctx, conn, crafted, 5, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatalf("BeginFunc: %v", err)
	}
	checkOutcome(t, g.BeginFunc(ctx, conn, crafted, 4, func(pgx.Tx) error { return nil }), stale, 4, 5, crafted)
	const viaAdvance = crafted + " (advance)"
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return g.Advance(ctx, tx, viaAdvance, 7) }); err != nil {
		t.Fatalf("Advance: %v", err)
	}

	if n := e.int64Query(t, `SELECT count(*) FROM canary`); n != 0 { // fails if canary was dropped
		t.Fatalf("canary has %d rows", n)
	}
	rows, err := e.Pool.Query(ctx, `SELECT resource, token FROM fencekit_resource_tokens ORDER BY token`)
	if err != nil {
		t.Fatal(err)
	}
	type stored struct {
		Resource string
		Token    int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[stored])
	if err != nil {
		t.Fatal(err)
	}
	if want := []stored{{crafted, 5}, {viaAdvance, 7}}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("stored resources %+v, want %+v", got, want)
	}
}
