package sqlguard_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit"
	"github.com/fencekit/fencekit/sqlguard"
)

// TestConformanceTable runs the guard conformance suite against
// row-level fencing: a resource is one row of a table with a
// lock_version column, written with Table.Update (so a missing row is a
// missing target: ErrNotFound).
func TestConformanceTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE conf_rows (id bigint PRIMARY KEY, value text NOT NULL DEFAULT '',
		lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))`)
	tbl, err := sqlguard.NewTable("", "conf_rows", "id")
	if err != nil {
		t.Fatal(err)
	}
	var ids atomic.Int64
	newRow := func(t *testing.T, exists bool) guardtest.Resource {
		r := &confRow{confDB: newConfDB(t, e, "UPDATE 1"), tbl: tbl, id: ids.Add(1)}
		if exists {
			e.exec(t, `INSERT INTO conf_rows (id) VALUES ($1)`, r.id)
		}
		return r
	}
	cfg := guardtest.Config{
		NewResource: func(t *testing.T) guardtest.Resource { return newRow(t, true) },
		NewMissing:  func(t *testing.T) guardtest.Resource { return newRow(t, false) },
		IsMissing:   func(err error) bool { return errors.Is(err, fence.ErrNotFound) },
		CountIO:     func(r guardtest.Resource) int64 { return r.(*confRow).wire.Requests.Load() },
		LoseReply:   func(t *testing.T, r guardtest.Resource) { r.(*confRow).wire.Arm() },
	}
	confLacks(e, &cfg)
	guardtest.Run(t, cfg)
}

// TestConformanceBeginFunc runs the guard conformance suite against
// fenced transactions: a resource is a resource name of Guard.BeginFunc,
// whose function stores the value in a plain table in the same
// transaction. A resource name needs no creating, so there is no missing
// target.
func TestConformanceBeginFunc(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE conf_values (resource text PRIMARY KEY, value text NOT NULL)`)
	g, err := sqlguard.New()
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	cfg := guardtest.Config{
		NewResource: func(t *testing.T) guardtest.Resource {
			return &confTx{confDB: newConfDB(t, e, "COMMIT"), g: g, name: fmt.Sprintf("conf/%d 'x'", n.Add(1))}
		},
		CountIO:   func(r guardtest.Resource) int64 { return r.(*confTx).wire.Requests.Load() },
		LoseReply: func(t *testing.T, r guardtest.Resource) { r.(*confTx).wire.Arm() },
		Lacks: map[guardtest.Capability]string{
			guardtest.Missing: "BeginFunc creates a resource's token row at its first advance: no resource name is missing",
		},
	}
	confLacks(e, &cfg)
	guardtest.Run(t, cfg)
}

// confLacks declares LoseReply missing where the test cannot read the
// server's replies (TLS).
func confLacks(e *env, cfg *guardtest.Config) {
	pc, err := pgx.ParseConfig(e.url)
	if err == nil && pc.TLSConfig == nil {
		return
	}
	cfg.LoseReply = nil
	if cfg.Lacks == nil {
		cfg.Lacks = map[guardtest.Capability]string{}
	}
	cfg.Lacks[guardtest.LoseReply] = "FENCE_POSTGRES_URL uses TLS: the test cannot see which reply to lose"
}

// confDB is a resource's own pool (four connections, so that concurrent
// writers use several), dialled through a pgWire.
type confDB struct {
	e    *env
	wire *testkit.Wire
	pool *pgxpool.Pool
}

func newConfDB(t *testing.T, e *env, cutTag string) confDB {
	t.Helper()
	w := pgWire(cutTag)
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = e.schema
	cfg.ConnConfig.DialFunc = w.Dial
	cfg.MaxConns = 4
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return confDB{e: e, wire: w, pool: p}
}

// confRow is one row of conf_rows.
type confRow struct {
	confDB
	tbl *sqlguard.Table
	id  int64
}

func (r *confRow) Write(ctx context.Context, token fence.Token, value string) error {
	return r.tbl.Update(ctx, r.pool, []any{r.id}, token, sqlguard.Col("value", value))
}

func (r *confRow) Read(ctx context.Context) (string, fence.Token, error) {
	var v string
	var lv int64
	err := r.e.pool.QueryRow(ctx, `SELECT value, lock_version FROM conf_rows WHERE id = $1`, r.id).Scan(&v, &lv)
	return v, fence.Token(lv), err
}

// confTx is one resource name of a Guard.
type confTx struct {
	confDB
	g    *sqlguard.Guard
	name string
}

func (r *confTx) Write(ctx context.Context, token fence.Token, value string) error {
	return r.g.BeginFunc(ctx, r.pool, r.name, token, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO conf_values (resource, value) VALUES ($1, $2)
			ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value`, r.name, value)
		return err
	})
}

func (r *confTx) Read(ctx context.Context) (string, fence.Token, error) {
	var v string
	var tok int64
	err := r.e.pool.QueryRow(ctx, `SELECT
		coalesce((SELECT value FROM conf_values WHERE resource = $1), ''),
		coalesce((SELECT token FROM fencekit_resource_tokens WHERE resource = $1), 0)`, r.name).Scan(&v, &tok)
	return v, fence.Token(tok), err
}

// pgWire returns a testkit.Wire for a pool that, once armed, loses the
// reply to the first statement the server completes with cutTag ("UPDATE
// 1": a row written; "COMMIT": a transaction committed): it reads that
// reply to its ReadyForQuery (by then the server has committed it, the
// commit of an implicit transaction included) and loses it all.
func pgWire(cutTag string) *testkit.Wire {
	return &testkit.Wire{Message: readPGMessage, Cut: func(msg, _ []byte, r io.Reader) (bool, error) {
		if msg[0] != 'C' || strings.TrimRight(string(msg[5:]), "\x00") != cutTag {
			return false, nil
		}
		for msg[0] != 'Z' {
			var err error
			if msg, err = readPGMessage(r); err != nil {
				return false, err
			}
		}
		return true, nil
	}}
}

// readPGMessage reads one backend message: a type byte, a length that
// counts itself, and the body.
func readPGMessage(r io.Reader) ([]byte, error) {
	head := make([]byte, 5)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n < 4 {
		return nil, fmt.Errorf("pgWire: bad message length %d", n)
	}
	msg := make([]byte, 1+n)
	copy(msg, head)
	if _, err := io.ReadFull(r, msg[5:]); err != nil {
		return nil, err
	}
	return msg, nil
}
