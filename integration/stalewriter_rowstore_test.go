package integration

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "modernc.org/sqlite" // registers "sqlite"
)

// TestStaleWriterRowInMariaDBAndSQLite runs the stale-writer demo with
// the row in MariaDB and in SQLite (--row-store, fenced through dbguard):
// the paused holder's row write is rejected as stale, and the row, read
// here independently of the demo, holds B's write and B's token.
func TestStaleWriterRowInMariaDBAndSQLite(t *testing.T) {
	for _, store := range []string{"mariadb", "sqlite"} {
		t.Run(store, func(t *testing.T) {
			code, sum, out := runDemo(t, "--row-store", store)
			if sum.Run.RowStore != store || sum.Run.RowDSN == "" {
				t.Fatalf("the summary does not say where the row is: %+v\n%s", sum.Run, out)
			}
			driver := "mysql"
			if store == "sqlite" {
				driver = "sqlite"
			}
			t.Cleanup(func() { removeRowDB(t, store, sum.Run.RowDSN) })
			if code != 0 || !sum.OK {
				t.Fatalf("demo exited %d (ok %v); want 0\n%s", code, sum.OK, out)
			}
			rejected := false
			for _, e := range sum.Events {
				if e.Kind == "write" && e.Store == store && e.Role == "A" && !e.Accepted {
					rejected = strings.Contains(e.Text, "stale token")
				}
			}
			if !rejected {
				t.Fatalf("no stale write of A to %s was reported rejected\n%s", store, out)
			}
			db, err := sql.Open(driver, sum.Run.RowDSN)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var by, lv string
			if err := db.QueryRowContext(ctx, `SELECT written_by, lock_version FROM report WHERE id = ?`, sum.Run.RowID).Scan(&by, &lv); err != nil {
				t.Fatalf("reading the row: %v", err)
			}
			if by != "B" || lv != strconv.FormatUint(uint64(sum.TokenB), 10) {
				t.Fatalf("row written by %q with lock_version %s; want B with %d", by, lv, sum.TokenB)
			}
		})
	}
}

func removeRowDB(t *testing.T, store, dsn string) {
	if store == "sqlite" {
		path := strings.TrimPrefix(dsn, "file:")
		if i := strings.IndexByte(path, '?'); i >= 0 {
			path = path[:i]
		}
		if err := os.RemoveAll(filepath.Dir(path)); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
		return
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Errorf("cleaning up: %v", err)
		return
	}
	name := cfg.DBName
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return
	}
	defer db.Close()
	if _, err := db.Exec("DROP DATABASE IF EXISTS `" + strings.ReplaceAll(name, "`", "``") + "`"); err != nil {
		t.Errorf("cleaning up: %v", err)
	}
}
