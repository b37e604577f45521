package drivertest

import (
	"database/sql"
	"errors"
	"strconv"
	"testing"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/guardtest"
	"github.com/fencekit/fencekit/internal/testkit"
)

// Every Table write, Advance and BeginFunc reports one event with its
// outcome, classified from the error the caller got, on both engines.
func TestObserverSeesEveryWrite(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			db, plain := newRows(t, d)
			rec := &guardtest.Recorder{}
			tbl := plain.WithObserver(rec)
			ctx := testkit.Context(t)
			want := func(op string, id int, token fence.Token, o fence.Outcome) guardtest.Want {
				return guardtest.Want{Guard: "dbguard", Class: "rows_t", Op: op, Resource: "rows_t(id=" + strconv.Itoa(id) + ")", Token: token, Outcome: o}
			}
			err := tbl.Insert(ctx, db.SQL, []any{1}, 5, dbguard.Col("value", "a"))
			rec.One(t, want("insert", 1, 5, fence.Accepted), err)
			err = tbl.Update(ctx, db.SQL, []any{1}, 4, dbguard.Col("value", "b"))
			rec.One(t, want("update", 1, 4, fence.Rejected), err)
			err = tbl.Delete(ctx, db.SQL, []any{2}, 9)
			rec.One(t, want("delete", 2, 9, fence.Failed), err)
			if !errors.Is(err, fence.ErrNotFound) {
				t.Fatalf("Delete of a missing row: %v", err)
			}
			err = tbl.Upsert(ctx, db.SQL, []any{1}, fence.None)
			rec.One(t, want("upsert", 1, fence.None, fence.Failed), err)
			if err := plain.Update(ctx, db.SQL, []any{1}, 6); err != nil || len(rec.Take()) != 0 {
				t.Fatalf("a write through the Table without an observer: %v, or it reported", err)
			}

			g, err := dbguard.New(d, dbguard.WithObserver(rec))
			if err != nil {
				t.Fatal(err)
			}
			tx := func(r string) guardtest.Want {
				return guardtest.Want{Guard: "dbguard", Class: "transaction", Op: "transaction", Resource: r, Token: 7, Outcome: fence.Accepted}
			}
			err = g.BeginFunc(ctx, db.SQL, "job/1", 7, func(*sql.Tx) error { return nil })
			rec.One(t, tx("job/1"), err)
			err = g.BeginFunc(ctx, db.SQL, "job/1", 6, func(*sql.Tx) error { return nil })
			w := tx("job/1")
			w.Token, w.Outcome = 6, fence.Rejected
			rec.One(t, w, err)
			sqlTx, err := db.SQL.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sqlTx.Rollback() //nolint:errcheck
			err = g.Advance(ctx, sqlTx, "job/2", 3)
			rec.One(t, guardtest.Want{Guard: "dbguard", Class: "transaction", Op: "advance", Resource: "job/2", Token: 3, Outcome: fence.Accepted}, err)
		})
	}
}
