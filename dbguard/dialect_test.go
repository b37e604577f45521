package dbguard

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct {
		d        Dialect
		db, name string
		want     string
	}{
		{MySQL, "", "orders", "`orders`"},
		{MySQL, "shop", "a`b", "`shop`.`a``b`"},
		{MySQL, "", `x"; DROP TABLE y; --`, "`x\"; DROP TABLE y; --`"},
		{SQLite, "", `a"b`, `"a""b"`},
		{SQLite, "main", "t`x", `"main"."t` + "`" + `x"`},
	} {
		if got := tc.d.qualified(tc.db, tc.name); got != tc.want {
			t.Errorf("%v.qualified(%q, %q) = %s; want %s", tc.d, tc.db, tc.name, got, tc.want)
		}
	}
}

func TestTokenArg(t *testing.T) {
	for _, tc := range []struct {
		d       Dialect
		tok     fence.Token
		want    any
		invalid bool
	}{
		{MySQL, 0, nil, true},
		{SQLite, 0, nil, true},
		{MySQL, math.MaxUint64, uint64(math.MaxUint64), false},
		{SQLite, math.MaxInt64, int64(math.MaxInt64), false},
		{SQLite, math.MaxInt64 + 1, nil, true},
	} {
		got, err := tc.d.tokenArg(tc.tok)
		if tc.invalid != errors.Is(err, fence.ErrInvalidToken) || (!tc.invalid && got != tc.want) {
			t.Errorf("%v.tokenArg(%d) = %v, %v", tc.d, tc.tok, got, err)
		}
	}
}

func TestCheckIdent(t *testing.T) {
	long := ""
	for range 65 {
		long += "é"
	}
	for _, tc := range []struct {
		d  Dialect
		s  string
		ok bool
	}{
		{MySQL, "orders", true},
		{MySQL, "", false},
		{MySQL, "a\x00b", false},
		{MySQL, "\xff", false},
		{MySQL, "trailing ", false},
		{SQLite, "trailing ", true},
		{MySQL, long, false},    // 65 characters
		{MySQL, long[2:], true}, // 64 characters, 128 bytes
		{SQLite, long, true},
	} {
		if err := tc.d.checkIdent("table", tc.s); (err == nil) != tc.ok || (err != nil && !errors.Is(err, fence.ErrInvalidArgument)) {
			t.Errorf("%v.checkIdent(%q) = %v; want ok %v", tc.d, tc.s, err, tc.ok)
		}
	}
}

// MySQLError has the shape of go-sql-driver's *mysql.MySQLError, which
// the guard reads by reflection so that it need not import the driver.
type MySQLError struct {
	Number   uint16
	SQLState [5]byte
	Message  string
}

func (e *MySQLError) Error() string { return fmt.Sprintf("Error %d: %s", e.Number, e.Message) }

type liteErr struct{ code int }

func (e *liteErr) Error() string { return "sqlite error" }
func (e *liteErr) Code() int     { return e.code }

func TestDriverErrors(t *testing.T) {
	deadlock := fmt.Errorf("wrapped: %w", &MySQLError{Number: myDeadlock})
	if n, ok := mysqlNumber(deadlock); !ok || n != myDeadlock {
		t.Fatalf("mysqlNumber = %d, %v", n, ok)
	}
	if !IsRetryable(deadlock) || !IsRetryable(errors.Join(errors.New("x"), &liteErr{code: 5 | 2<<8})) {
		t.Error("a deadlock and SQLITE_BUSY_RECOVERY should be retryable")
	}
	if IsRetryable(&MySQLError{Number: myDupEntry}) || IsRetryable(fence.Stale("r", 1, 2)) {
		t.Error("a duplicate key and a stale token are not retryable")
	}
	if !MySQL.dupKey(&MySQLError{Number: myDupEntry}) || !SQLite.dupKey(&liteErr{code: 2067}) || SQLite.dupKey(&liteErr{code: 19}) {
		t.Error("dupKey")
	}
	if MySQL.storeErr(errors.New("invalid connection")) || !SQLite.storeErr(&liteErr{code: 1}) {
		t.Error("storeErr")
	}
	var typed *MySQLError
	if _, ok := mysqlNumber(typed); ok {
		t.Error("a nil *MySQLError is no answer")
	}
}
