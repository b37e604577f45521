// Package rowguard is what the SQL guards' row-level fencing shares,
// whatever the database: sqlguard.Table (PostgreSQL, pgx) and
// dbguard.Table (MySQL, MariaDB and SQLite, database/sql) check their
// names, keys and columns, cache the statements they build, name a row
// in their errors and judge what a write's exact path found, here, in one
// place. Each guard keeps what its database alone decides: the SQL it
// builds and how it reads its driver's errors. It imports only the
// standard library and package fence.
package rowguard

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/names"
)

// LockVersion is the column row-level fencing reads and writes.
const LockVersion = "lock_version"

// The columns of a ledger's table (sqlguard.Ledger, dbguard.Ledger): the
// job, the run's key, and when the run was marked done (NULL until then).
const (
	JobColumn  = "job"
	KeyColumn  = "run_key"
	DoneColumn = "done_at"
)

// Column is one column of a row and the value to write to it. Value is
// passed to the driver as a bind parameter, never formatted into SQL.
type Column struct {
	Name  string
	Value any
}

// Kind is the kind of a row write.
type Kind int

// The kinds of row write, in the order of a Table's statement cache.
const (
	Update Kind = iota
	Insert
	Upsert
	Delete
	kinds
)

// String returns "update", "insert", "upsert" or "delete": the write's
// Op in a fence.WriteEvent, and the verb of its errors.
func (k Kind) String() string {
	return [...]string{"update", "insert", "upsert", "delete"}[k]
}

// Creates reports whether k may create the row (Insert, Upsert), which
// needs a unique index on exactly the key columns.
func (k Kind) Creates() bool { return k == Insert || k == Upsert }

// Ident validates one identifier of a kind ("table", "key column") for a
// database, returning an error wrapping fence.ErrInvalidArgument.
type Ident func(kind, s string) error

// Spec is what a fenced table is, before any statement: its name for
// messages and its key columns, checked.
type Spec struct {
	// Guard is the guard's package name, the prefix of its errors.
	Guard string
	// Name is the table's name as given (schema.table or table).
	Name string
	// Keys are the key columns, in the order key values are passed.
	Keys []string
}

// NewSpec checks a table's names for guard: schema (may be empty), name
// and keyColumns, each with ident, and that there is a key column, none
// repeats and none is lock_version. It reports every problem at once, as
// an error wrapping fence.ErrInvalidArgument.
func NewSpec(guard string, ident Ident, schema, name string, keyColumns []string) (*Spec, error) {
	var errs []error
	if schema != "" {
		errs = append(errs, ident("schema", schema))
	}
	errs = append(errs, ident("table", name))
	if len(keyColumns) == 0 {
		errs = append(errs, fmt.Errorf("%w: no key columns", fence.ErrInvalidArgument))
	}
	seen := make(map[string]bool, len(keyColumns))
	for _, k := range keyColumns {
		if err := ident("key column", k); err != nil {
			errs = append(errs, err)
			continue
		}
		if k == LockVersion {
			errs = append(errs, fmt.Errorf("%w: %s cannot be a key column", fence.ErrInvalidArgument, LockVersion))
		}
		if seen[k] {
			errs = append(errs, fmt.Errorf("%w: key column %q given twice", fence.ErrInvalidArgument, k))
		}
		seen[k] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s := &Spec{Guard: guard, Name: name, Keys: slices.Clone(keyColumns)}
	if schema != "" {
		s.Name = schema + "." + name
	}
	return s, nil
}

// CheckWrite checks a write's database and key values, reporting every
// problem at once: a nil database, the wrong number of key values, a NULL
// key value (which matches no row and conflicts with none).
func (s *Spec) CheckWrite(db any, key []any) error {
	var errs []error
	if IsNil(db) {
		errs = append(errs, fmt.Errorf("%w: nil database", fence.ErrInvalidArgument))
	}
	if len(key) != len(s.Keys) {
		errs = append(errs, fmt.Errorf("%w: %d key values for %d key columns", fence.ErrInvalidArgument, len(key), len(s.Keys)))
	}
	for i, v := range key[:min(len(key), len(s.Keys))] {
		if IsNull(v) {
			errs = append(errs, fmt.Errorf("%w: key column %q is NULL (a NULL key matches no row and conflicts with none)", fence.ErrInvalidArgument, s.Keys[i]))
		}
	}
	return errors.Join(errs...)
}

// CheckColumns checks the columns of a write, reporting every problem at
// once: a name ident refuses, lock_version (written by the guard only), a
// key column (its value goes in the key), a column given twice.
func (s *Spec) CheckColumns(ident Ident, cols []Column) error {
	var errs []error
	for i, c := range cols {
		if err := ident("column", c.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		switch {
		case c.Name == LockVersion:
			errs = append(errs, fmt.Errorf("%w: column %s is written by the guard only", fence.ErrInvalidArgument, LockVersion))
		case slices.Contains(s.Keys, c.Name):
			errs = append(errs, fmt.Errorf("%w: column %q is a key column; pass its value in key", fence.ErrInvalidArgument, c.Name))
		case slices.ContainsFunc(cols[:i], func(p Column) bool { return p.Name == c.Name }):
			errs = append(errs, fmt.Errorf("%w: column %q given twice", fence.ErrInvalidArgument, c.Name))
		}
	}
	return errors.Join(errs...)
}

// Resource names one row for errors and events: table(k1=v1, k2=v2).
func (s *Spec) Resource(key []any) string {
	var b strings.Builder
	b.WriteString(s.Name)
	b.WriteByte('(')
	for i, k := range s.Keys {
		if i > 0 {
			b.WriteString(", ")
		}
		if i < len(key) {
			fmt.Fprintf(&b, "%s=%v", k, key[i])
		} else {
			b.WriteString(k + "=?")
		}
	}
	b.WriteByte(')')
	return b.String()
}

// Statements caches, per write kind, the statements a Table built for the
// most recent list of columns: callers mostly write the same columns
// again, and then nothing is built or checked. Its zero value is ready; it
// is safe for concurrent use.
type Statements[S any] struct {
	last [kinds]atomic.Pointer[built[S]]
}

type built[S any] struct {
	cols []string
	st   S
}

// For returns the statements of a write of kind with cols: the cached
// ones when the column names are the same as last time, otherwise the
// ones build makes (build checks the columns; its error is returned and
// nothing is cached).
func (c *Statements[S]) For(kind Kind, cols []Column, build func() (S, error)) (S, error) {
	if b := c.last[kind].Load(); b != nil && sameNames(b.cols, cols) {
		return b.st, nil
	}
	st, err := build()
	if err != nil {
		return st, err
	}
	b := &built[S]{cols: make([]string, len(cols)), st: st}
	for i, col := range cols {
		b.cols[i] = col.Name
	}
	c.last[kind].Store(b)
	return st, nil
}

func sameNames(names []string, cols []Column) bool {
	if len(names) != len(cols) {
		return false
	}
	for i, c := range cols {
		if names[i] != c.Name {
			return false
		}
	}
	return true
}

// Found is what a write's exact path found of the row, locked: how many
// rows have the key, and the newest one's lock_version (Current, valid
// when HasCurrent; a NULL one otherwise).
type Found struct {
	Rows       int
	Current    uint64
	HasCurrent bool
}

// Verdict is what a write may do with the row it found.
type Verdict int

const (
	// Write: the row's lock_version is <= the token: write it (or, for an
	// Insert that found none, Create).
	Write Verdict = iota
	// Create: no row has the key; an Insert or Upsert creates it.
	Create
	// Ambiguous: several rows have the key (fence.ErrAmbiguousKey).
	Ambiguous
	// Missing: no row has the key, and an Update or Delete needs one
	// (fence.ErrNotFound).
	Missing
	// NullVersion: the row's lock_version is NULL.
	NullVersion
	// Stale: the row's lock_version is newer than the token.
	Stale
	// Exists: an Insert found the row, not newer (fence.ErrExists).
	Exists
)

// Judge returns what a write of kind with token may do with f.
func Judge(kind Kind, f Found, token fence.Token) Verdict {
	switch {
	case f.Rows > 1:
		return Ambiguous
	case f.Rows == 0 && kind.Creates():
		return Create
	case f.Rows == 0:
		return Missing
	case !f.HasCurrent:
		return NullVersion
	case f.Current > uint64(token):
		return Stale
	case kind == Insert:
		return Exists
	}
	return Write
}

// Refusal returns the error of a verdict that refuses the write (nil for
// Write and Create): op is what was being done, key the row's key values.
func (s *Spec) Refusal(v Verdict, op string, key []any, token fence.Token, f Found) error {
	res := s.Resource(key)
	switch v {
	case Ambiguous:
		return fmt.Errorf("%s: %s: %w: %s matches %d rows", s.Guard, op, fence.ErrAmbiguousKey, res, f.Rows)
	case Missing:
		return fmt.Errorf("%s: %s: %w", s.Guard, op, &fence.NotFoundError{Resource: res})
	case NullVersion:
		return fmt.Errorf("%s: %s: %s has a NULL %s (the column must be NOT NULL)", s.Guard, op, res, LockVersion)
	case Stale:
		return fence.Stale(res, token, fence.Token(f.Current))
	case Exists:
		return fmt.Errorf("%s: %s: %w: %s (%s %d)", s.Guard, op, fence.ErrExists, res, LockVersion, f.Current)
	}
	return nil
}

// Changed is the error of a row that changed under the write in a way
// its statement could not follow: worth trying again.
func (s *Spec) Changed(op string, key []any) error {
	return &fence.RetryableError{Op: s.Guard + ": " + op, Err: fmt.Errorf("%s changed concurrently", s.Resource(key))}
}

// NoUniqueKey is the error of an Insert or Upsert on a table without a
// unique index on exactly the key columns.
func (s *Spec) NoUniqueKey(op string, kind Kind) error {
	return fmt.Errorf("%s: %s: %w: %s has no unique index on exactly (%s), which %s needs",
		s.Guard, op, fence.ErrAmbiguousKey, s.Name, strings.Join(s.Keys, ", "), kind)
}

// CheckFenced checks the arguments of a fenced transaction (a Guard's
// Advance or BeginFunc), reporting every problem at once: tokErr (the
// token's, from the guard's own conversion), a nil database, a resource
// name CheckResource refuses, and, for BeginFunc, a nil function (fn
// false).
func CheckFenced(tokErr error, db any, resource string, max int, fn bool) error {
	if tokErr == nil && fn && !IsNil(db) {
		// The common case, without the list: the same error, joined
		// as below, if only the resource name is bad.
		if err := CheckResource(resource, max); err != nil {
			return errors.Join(err)
		}
		return nil
	}
	errs := []error{tokErr, CheckResource(resource, max)}
	if IsNil(db) {
		errs = append(errs, fmt.Errorf("%w: nil database", fence.ErrInvalidArgument))
	}
	if !fn {
		errs = append(errs, fmt.Errorf("%w: nil function", fence.ErrInvalidArgument))
	}
	return errors.Join(errs...)
}

// CheckRun checks the arguments of a ledger's call (Claim, MarkDone),
// reporting every problem at once: tokErr (the token's, from the guard's
// own conversion), an empty job, an empty run key.
func CheckRun(tokErr error, job, key string) error {
	errs := []error{tokErr}
	if job == "" {
		errs = append(errs, fmt.Errorf("%w: the job name is empty", fence.ErrInvalidArgument))
	}
	if key == "" {
		errs = append(errs, fmt.Errorf("%w: the run key is empty", fence.ErrInvalidArgument))
	}
	return errors.Join(errs...)
}

// Retryable reports whether err is worth retrying as a whole
// transaction: never for a stale token; always for an error matching
// fence.ErrRetryable; otherwise as driver says of the driver's own error
// (a deadlock, a serialization failure, a busy database).
func Retryable(err error, driver func(error) bool) bool {
	switch {
	case err == nil || errors.Is(err, fence.ErrStaleToken):
		return false
	case errors.Is(err, fence.ErrRetryable):
		return true
	}
	return driver(err)
}

// CheckResource checks a resource name of a Guard (resource-level
// fencing): not empty, at most max bytes, UTF-8, no NUL byte.
func CheckResource(resource string, max int) error {
	return names.Check(fence.ErrInvalidArgument, "resource name", resource, names.Rules{Max: max})
}

// IsNull reports whether a driver would send v as SQL NULL: v is nil, a
// nil pointer, map or slice, or a driver.Valuer (database/sql's Null
// types, pgx's pgtype types) whose Value is nil.
func IsNull(v any) bool {
	if IsNil(v) {
		return true
	}
	if vr, ok := v.(driver.Valuer); ok {
		dv, err := vr.Value()
		return err == nil && dv == nil
	}
	return false
}

// IsNil reports whether v is nil or a typed nil pointer (or other nilable
// value) inside an interface.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
