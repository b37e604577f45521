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

// RowTypeIsBigint returns an SQL boolean expression that is true when the
// lock_version field of the row type named ident (quoted, as for TypeOf)
// is bigint. It costs nothing at run time (the type is resolved when the
// statement is parsed), but names the row type, which is looked up among
// types rather than relations: it agrees with IsBigint unless a schema
// earlier in the search_path holds a stand-alone type of the table's name.
// Use it only as a cheap re-check where IsBigint or InCatalog has already
// been answered for the table.
func RowTypeIsBigint(ident string) string {
	return "pg_catalog.pg_typeof((NULL::" + ident + ")." + Column + ") = 'pg_catalog.int8'::pg_catalog.regtype"
}

// InCatalog returns an SQL boolean expression that is true when the
// relation whose oid the SQL expression relid gives has a lock_version
// column of type bigint, false when it has one of another type, no such
// column, or relid is NULL. Unlike IsBigint it cannot fail to parse, so a
// probe built on it never aborts the transaction it runs in.
func InCatalog(relid string) string {
	return "coalesce((SELECT a.atttypid = 'pg_catalog.int8'::pg_catalog.regtype FROM pg_catalog.pg_attribute a" +
		" WHERE a.attrelid = " + relid + " AND a.attname = '" + Column + "' AND NOT a.attisdropped), false)"
}
