package rowguard

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

func ident(kind, s string) error {
	if s == "" || strings.ContainsRune(s, 0) {
		return fmt.Errorf("%w: bad %s name %q", fence.ErrInvalidArgument, kind, s)
	}
	return nil
}

func TestNewSpecReportsEveryProblem(t *testing.T) {
	_, err := NewSpec("g", ident, "", "", []string{"id", "id", LockVersion, ""})
	for _, want := range []string{"table name", `"id" given twice`, "cannot be a key column", "key column name"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewSpec = %v; want it to say %q", err, want)
		}
	}
	if !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("NewSpec = %v; want fence.ErrInvalidArgument", err)
	}
	if _, err := NewSpec("g", ident, "s", "t", nil); err == nil || !strings.Contains(err.Error(), "no key columns") {
		t.Errorf("NewSpec without keys = %v", err)
	}
	s, err := NewSpec("g", ident, "shop", "orders", []string{"id", "line"})
	if err != nil || s.Name != "shop.orders" {
		t.Fatalf("NewSpec = %+v, %v", s, err)
	}
	if got := s.Resource([]any{42, "a"}); got != "shop.orders(id=42, line=a)" {
		t.Errorf("Resource = %q", got)
	}
	if got := s.Resource([]any{42}); got != "shop.orders(id=42, line=?)" {
		t.Errorf("Resource of a short key = %q", got)
	}
}

func TestCheckWriteAndColumns(t *testing.T) {
	s, _ := NewSpec("g", ident, "", "t", []string{"id", "k"})
	var nilDB *sql.DB
	err := s.CheckWrite(nilDB, []any{sql.NullString{}})
	for _, want := range []string{"nil database", "1 key values for 2", `key column "id" is NULL`} {
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("CheckWrite = %v; want %q", err, want)
		}
	}
	if err := s.CheckWrite(&sql.DB{}, []any{1, "x"}); err != nil {
		t.Errorf("CheckWrite of a good write = %v", err)
	}
	err = s.CheckColumns(ident, []Column{{Name: LockVersion}, {Name: "k"}, {Name: "v"}, {Name: "v"}, {Name: ""}})
	for _, want := range []string{"written by the guard only", `"k" is a key column`, `"v" given twice`, "bad column name"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckColumns = %v; want %q", err, want)
		}
	}
}

func TestStatementsCacheByNames(t *testing.T) {
	var c Statements[string]
	builds := 0
	build := func(v string, err error) func() (string, error) {
		return func() (string, error) { builds++; return v, err }
	}
	cols := []Column{{Name: "a", Value: 1}}
	if st, _ := c.For(Update, cols, build("one", nil)); st != "one" {
		t.Fatal(st)
	}
	if st, _ := c.For(Update, []Column{{Name: "a", Value: 2}}, build("two", nil)); st != "one" || builds != 1 {
		t.Fatalf("the same names built again: %q, %d builds", st, builds)
	}
	if _, err := c.For(Update, []Column{{Name: "b"}}, build("", errors.New("bad"))); err == nil {
		t.Fatal("a failed build was not reported")
	}
	if st, _ := c.For(Update, cols, build("three", nil)); st != "one" {
		t.Fatalf("a failed build replaced the cache: %q", st)
	}
	if st, _ := c.For(Delete, cols, build("del", nil)); st != "del" {
		t.Fatalf("kinds share a cache: %q", st)
	}
}

func TestJudgeAndRefusal(t *testing.T) {
	s, _ := NewSpec("g", ident, "", "t", []string{"id"})
	key := []any{7}
	for _, tc := range []struct {
		kind  Kind
		f     Found
		token fence.Token
		want  Verdict
		is    error
	}{
		{Update, Found{Rows: 2, Current: 1, HasCurrent: true}, 5, Ambiguous, fence.ErrAmbiguousKey},
		{Update, Found{}, 5, Missing, fence.ErrNotFound},
		{Delete, Found{}, 5, Missing, fence.ErrNotFound},
		{Insert, Found{}, 5, Create, nil},
		{Upsert, Found{}, 5, Create, nil},
		{Update, Found{Rows: 1}, 5, NullVersion, nil},
		{Update, Found{Rows: 1, Current: 9, HasCurrent: true}, 5, Stale, fence.ErrStaleToken},
		{Insert, Found{Rows: 1, Current: 9, HasCurrent: true}, 5, Stale, fence.ErrStaleToken},
		{Insert, Found{Rows: 1, Current: 5, HasCurrent: true}, 5, Exists, fence.ErrExists},
		{Upsert, Found{Rows: 1, Current: 5, HasCurrent: true}, 5, Write, nil},
		{Delete, Found{Rows: 1, Current: 4, HasCurrent: true}, 5, Write, nil},
	} {
		v := Judge(tc.kind, tc.f, tc.token)
		if v != tc.want {
			t.Errorf("Judge(%s, %+v, %d) = %d, want %d", tc.kind, tc.f, tc.token, v, tc.want)
			continue
		}
		err := s.Refusal(v, "op", key, tc.token, tc.f)
		switch {
		case (v == Write || v == Create) != (err == nil):
			t.Errorf("Refusal(%d) = %v", v, err)
		case tc.is != nil && !errors.Is(err, tc.is):
			t.Errorf("Refusal(%d) = %v, want %v", v, err, tc.is)
		case v == Stale:
			if se, ok := fence.AsStale(err); !ok || se.Presented != 5 || se.Current != 9 || se.Resource != "t(id=7)" {
				t.Errorf("stale refusal = %+v", se)
			}
		}
	}
	if err := s.Changed("op", key); !errors.Is(err, fence.ErrRetryable) || !strings.HasPrefix(err.Error(), "g: op: retryable") {
		t.Errorf("Changed = %v", err)
	}
	if err := s.NoUniqueKey("op", Insert); !errors.Is(err, fence.ErrAmbiguousKey) {
		t.Errorf("NoUniqueKey = %v", err)
	}
}

func TestCheckFencedAndRetryable(t *testing.T) {
	err := CheckFenced(fence.None.Validate(), nil, strings.Repeat("x", 11), 10, false)
	for _, want := range []error{fence.ErrInvalidToken, fence.ErrInvalidArgument} {
		if !errors.Is(err, want) {
			t.Errorf("CheckFenced = %v, want %v", err, want)
		}
	}
	for _, want := range []string{"nil database", "nil function", "longer than 10 bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CheckFenced = %v; want %q", err, want)
		}
	}
	db := &struct{}{}
	if err := CheckFenced(nil, db, "orders", 10, true); err != nil {
		t.Errorf("CheckFenced with good arguments = %v", err)
	}
	// Only the resource is bad: the error of the general path.
	err = CheckFenced(nil, db, "a\x00b", 10, true)
	if want := errors.Join(CheckResource("a\x00b", 10)); err == nil || err.Error() != want.Error() || !errors.Is(err, fence.ErrInvalidArgument) {
		t.Errorf("CheckFenced with a bad resource = %v, want %v", err, want)
	}
	var typed *struct{}
	if err := CheckFenced(nil, typed, "orders", 10, true); err == nil || !strings.Contains(err.Error(), "nil database") {
		t.Errorf("CheckFenced with a typed nil database = %v", err)
	}
	for _, r := range []string{"", "a\x00b", "\xff"} {
		if CheckResource(r, 10) == nil {
			t.Errorf("CheckResource(%q) = nil", r)
		}
	}
	deadlock := errors.New("deadlock")
	driver := func(err error) bool { return errors.Is(err, deadlock) }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{deadlock, true},
		{&fence.RetryableError{Op: "x", Err: errors.New("y")}, true},
		{errors.Join(fence.Stale("r", 1, 2), deadlock), false},
		{errors.New("other"), false},
	} {
		if got := Retryable(tc.err, driver); got != tc.want {
			t.Errorf("Retryable(%v) = %v", tc.err, got)
		}
	}
}
