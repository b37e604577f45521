package dbguard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/fence"
)

// A fenced transaction on MariaDB: the resource's token is advanced and
// its row held until commit, so a holder that lost its lease cannot commit
// anything. The program imports the driver itself:
//
//	import _ "github.com/go-sql-driver/mysql"
func ExampleGuard_BeginFunc() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app@tcp(127.0.0.1:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	guard, err := dbguard.New(dbguard.MySQL)
	if err != nil {
		log.Fatal(err)
	}
	var token fence.Token = 1764582014351234 // from your lease
	err = guard.BeginFunc(ctx, db, "order/42", token, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'shipped' WHERE id = ?`, 42)
		return err
	})
	switch {
	case errors.Is(err, fence.ErrStaleToken):
		log.Print("a newer holder got there: stop")
	case dbguard.IsRetryable(err):
		log.Print("deadlock or busy database: run the whole transaction again")
	case errors.Is(err, fence.ErrOutcomeUnknown):
		log.Print("COMMIT was sent and no answer came: read the data again")
	case err != nil:
		log.Fatal(err)
	}
}

// Row-level fencing on SQLite (modernc.org/sqlite, no cgo): the row is
// written only if its lock_version is <= the token. A busy timeout lets a
// second writer wait for the first instead of failing at once.
//
//	import _ "modernc.org/sqlite"
func ExampleTable_Update() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	orders, err := dbguard.NewTable(dbguard.SQLite, "", "orders", "id")
	if err != nil {
		log.Fatal(err)
	}
	err = orders.Update(ctx, db, []any{42}, 1764582014351234, dbguard.Col("status", "paid"))
	var stale *fence.StaleError
	switch {
	case errors.As(err, &stale):
		log.Printf("rejected: the row holds token %d, newer than ours (%d)", stale.Current, stale.Presented)
	case errors.Is(err, fence.ErrNotFound):
		log.Print("no order 42")
	case err != nil:
		log.Fatal(err)
	}
}

// Bad input is refused before any I/O, every problem at once.
func ExampleNewTable() {
	_, err := dbguard.NewTable(dbguard.MySQL, "", "orders ", "lock_version")
	fmt.Println(err)
	fmt.Println(errors.Is(err, fence.ErrInvalidArgument))
	_, err = dbguard.NewTable(dbguard.SQLite, "", "orders", "id")
	fmt.Println(err)
	// Output:
	// fence: invalid argument: table name "orders " ends with a space
	// fence: invalid argument: lock_version cannot be a key column
	// true
	// <nil>
}
