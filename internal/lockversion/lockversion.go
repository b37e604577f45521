// Package lockversion is the one definition of what a lock_version column
// must be, shared by package migrations (which adds the column and refuses
// one of another type) and package sqlguard (whose every row-level write
// checks it), so that the two can never disagree.
//
// The column must be bigint: the guard compares and stores fencing tokens,
// which use the whole int64 range. With real or double precision, distinct
// large tokens round to the same value and a stale write passes the
// comparison; smallint and integer overflow on the tokens a lease hands
// out; numeric and the string types would store values the guard cannot
// read back as tokens.
package lockversion

// Column is the column's name.
const Column = "lock_version"

// Type is the only type the column may have, as format_type spells it.
const Type = "bigint"

// TypeOf returns an SQL expression of type regtype whose value is the
// declared type of the lock_version column of the table ident, which must
// already be quoted (pgx.Identifier.Sanitize), schema-qualified or not.
// The table is looked up exactly as in the rest of a statement that names
// it, and no row is read: the subquery is planned as an empty result. The
// expression fails to parse when the table has no lock_version column.
func TypeOf(ident string) string {
	return "pg_catalog.pg_typeof((SELECT " + Column + " FROM " + ident + " WHERE false))"
}

// IsBigint returns an SQL boolean expression that is true when the
// lock_version column of the table ident (quoted, as for TypeOf) is bigint.
func IsBigint(ident string) string {
	return TypeOf(ident) + " = 'pg_catalog.int8'::pg_catalog.regtype"
}
