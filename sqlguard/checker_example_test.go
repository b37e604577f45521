package sqlguard_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/sqlguard"
)

// A service that receives fencing tokens (package fencehttp) checks them
// against PostgreSQL before its handlers run, or, to order its own writes
// too, advances the token in the transaction that writes them.
// (Compile-only: it needs a PostgreSQL server.)
func ExampleNewChecker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://127.0.0.1/app")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	checker, err := sqlguard.NewChecker(pool)
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /reports", func(w http.ResponseWriter, r *http.Request) {
		v, _ := fencewire.FromContext(r.Context())
		// The token is advanced in the transaction that writes the
		// service's state: a newer holder waits for it, a stale one
		// cannot commit.
		err := checker.Guard().BeginFunc(r.Context(), pool, v.Resource, v.Token, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), `INSERT INTO reports (body) VALUES ($1)`, "...")
			return err
		})
		if err != nil && !fencehttp.WriteError(w, err) {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	_ = http.ListenAndServe("127.0.0.1:8080", &fencehttp.Handler{Require: true, Next: mux})
}
