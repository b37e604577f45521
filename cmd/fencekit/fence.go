package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/migrations"
	"github.com/fencekit/fencekit/sqlguard"
)

// fencekit fence advance: push a token to a guarded resource through the
// guard's own operations, so that the writes of every holder of an older
// token (a revoked one) are refused there at once.

const fenceUsage = `Usage:
  fencekit fence advance --token N RESOURCE
                      raise the resource token of RESOURCE to N (package
                      sqlguard's fencekit_resource_tokens on PostgreSQL; with
                      --store mysql or sqlite, package dbguard's)
  fencekit fence advance --token N --table [schema.]TABLE --key COL=VALUE [--key ...]
                      raise the lock_version of one row to N (sqlguard.Table
                      or dbguard.Table: an update that changes no column)
  fencekit fence advance --token N --store dynamodb --table TABLE --key ATTR=VALUE [--key ...]
                      raise the fence of one item to N (dynamoguard: an update
                      that changes no attribute of yours; VALUE is a string,
                      or a number written n:VALUE)
  fencekit fence advance --token N --store s3 --bucket BUCKET KEY
                      raise the fence of one object to N (blobguard: the same
                      body written again with token N)

A token is never lowered: when the resource already has a newer token than
N, nothing is written, the command says which token the resource has, and
it exits with status 1. An equal token is accepted (nothing changes). After
fencekit lease revoke, pass the token its fence advance line names (the
revoked token + 1; fence_token with -o json): the revoked holder's writes
are refused from then on, and every later holder's token passes.

Flags:
  --token N        the token to push (required, 1 to 2^63-1)
  --store KIND     postgres (default), mysql, sqlite, dynamodb or s3
  --url ADDRESS    PostgreSQL URL ($FENCE_POSTGRES_URL), MySQL DSN
                   ($FENCE_MYSQL_URL), SQLite file, DynamoDB endpoint
                   ($FENCE_DYNAMODB_ENDPOINT) or S3 endpoint ($FENCE_S3_ENDPOINT;
                   keys from $FENCE_S3_ACCESS_KEY and $FENCE_S3_SECRET_KEY, else
                   the AWS configuration)
  --schema S       PostgreSQL: the schema of fencekit's resource tokens (for
                   RESOURCE); MySQL: the database
  --table T        the guarded table (a row's lock_version, or a DynamoDB item)
  --key C=V        a key column or attribute and its value (repeat for each)
  --bucket B       S3: the bucket ($FENCE_S3_BUCKET)
  -o table|json    the outcome as a line (default) or as JSON
  --timeout D      give up after this long (default 30s)
`

func runFence(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 || isHelp(args[0]) {
		w, code := stderr, exitUsage
		if len(args) > 0 {
			w, code = stdout, exitOK
		}
		fmt.Fprint(w, fenceUsage)
		return code
	}
	if args[0] != "advance" {
		fmt.Fprintf(stderr, "fencekit fence: unknown subcommand %q (advance)\n", args[0])
		return exitUsage
	}
	args = args[1:]
	fs := flag.NewFlagSet("fencekit fence advance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, fenceUsage) }
	var (
		f      fenceFlags
		token  uint64
		output string
	)
	fs.Uint64Var(&token, "token", 0, "the token to push")
	fs.StringVar(&f.store, "store", "postgres", "postgres, mysql, sqlite, dynamodb or s3")
	fs.StringVar(&f.url, "url", "", "the store's address")
	fs.StringVar(&f.schema, "schema", "", "PostgreSQL schema, or MySQL database")
	fs.StringVar(&f.table, "table", "", "the guarded table")
	fs.Var(&f.keys, "key", "COL=VALUE (repeat)")
	fs.StringVar(&f.bucket, "bucket", getenv("FENCE_S3_BUCKET"), "S3 bucket")
	fs.StringVar(&output, "o", "table", "table or json")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this long")
	for _, a := range args {
		if isHelp(a) {
			fmt.Fprint(stdout, fenceUsage)
			return exitOK
		}
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return exitUsage
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "fencekit fence advance: %s\n", fmt.Sprintf(format, a...))
		return exitUsage
	}
	f.token = fence.Token(token)
	if len(pos) == 1 {
		f.resource = pos[0]
	}
	switch {
	case len(pos) > 1:
		return usageErr("takes at most one RESOURCE or KEY, got %q", pos)
	case token == 0:
		return usageErr("--token is required (a token from 1 to 2^63-1)")
	case output != "table" && output != "json":
		return usageErr("-o is table or json, not %q", output)
	case f.timeout <= 0:
		return usageErr("--timeout must be positive")
	}
	if err := f.token.Validate(); err != nil {
		return usageErr("--token: %v", err)
	}
	if err := f.check(); err != nil {
		return usageErr("%v", err)
	}
	if f.url == "" {
		f.url = getenv(map[string]string{"postgres": databaseURLVar, "mysql": mysqlURLVar, "dynamodb": dynamoEndpoint, "s3": "FENCE_S3_ENDPOINT"}[f.store])
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	resource, err := f.advance(ctx, getenv)
	p := &printer{w: stdout, json: output == "json"}
	var stale *fence.StaleError
	switch {
	case errors.As(err, &stale):
		msg := fmt.Sprintf("refused: %s already has token %d, newer than %d: a token is never lowered", resource, stale.Current, f.token)
		if stale.Current == fence.None {
			msg = fmt.Sprintf("refused: %s already has a token newer than %d: a token is never lowered", resource, f.token)
		}
		if p.json {
			_ = p.doc(fenceJSON{Resource: resource, Token: uint64(f.token), Current: uint64(stale.Current)})
		}
		fmt.Fprintf(stderr, "fencekit fence advance: %s\n", msg)
		return exitFail
	case errors.Is(err, fence.ErrInvalidToken), errors.Is(err, fence.ErrInvalidArgument):
		// Refused by the guard before any write: the token or a name does
		// not fit the store.
		fmt.Fprintf(stderr, "fencekit fence advance: %v\n", err)
		return exitUsage
	case err != nil:
		fmt.Fprintf(stderr, "fencekit fence advance: %v\n", err)
		return exitFail
	}
	if p.json {
		_ = p.doc(fenceJSON{Advanced: true, Resource: resource, Token: uint64(f.token), Current: uint64(f.token)})
	} else {
		fmt.Fprintf(stdout, "advanced %s to token %d: writes with older tokens are refused there from now on\n", resource, f.token)
	}
	return exitOK
}

// fenceJSON is the outcome of fence advance with -o json.
type fenceJSON struct {
	Advanced bool   `json:"advanced"`
	Resource string `json:"resource"`
	Token    uint64 `json:"token"`
	// Current is the resource's token after the command: Token when
	// advanced; the newer token that refused it otherwise (0 when the
	// guard could not tell).
	Current uint64 `json:"current"`
}

// fenceFlags say what to advance.
type fenceFlags struct {
	store, url, schema, table, bucket, resource string
	keys                                        keyList
	token                                       fence.Token
	timeout                                     time.Duration
}

// check reports a combination of flags that names no resource.
func (f *fenceFlags) check() error {
	switch f.store {
	case "postgres", "mysql", "sqlite":
		if (f.table == "") == (f.resource == "") {
			return errors.New("name either a RESOURCE or a row (--table and --key), not both")
		}
		if f.table != "" && len(f.keys) == 0 {
			return errors.New("--table needs --key COL=VALUE for each key column")
		}
	case "dynamodb":
		if f.table == "" || len(f.keys) == 0 || f.resource != "" {
			return errors.New("--store dynamodb takes --table and --key ATTR=VALUE (no RESOURCE)")
		}
	case "s3":
		if f.bucket == "" || f.resource == "" {
			return errors.New("--store s3 takes --bucket (or $FENCE_S3_BUCKET) and the object KEY")
		}
	default:
		return fmt.Errorf("unknown --store %q (postgres, mysql, sqlite, dynamodb or s3)", f.store)
	}
	return nil
}

// advance pushes the token and returns the resource's name as the guard
// writes it.
func (f *fenceFlags) advance(ctx context.Context, getenv func(string) string) (string, error) {
	switch f.store {
	case "postgres":
		return f.advancePostgres(ctx)
	case "mysql", "sqlite":
		return f.advanceSQL(ctx)
	case "dynamodb":
		return f.advanceDynamo(ctx, getenv)
	default:
		return f.advanceS3(ctx, getenv)
	}
}

func (f *fenceFlags) advancePostgres(ctx context.Context) (string, error) {
	if f.url == "" {
		return f.resource, fmt.Errorf("no database URL: pass --url or set %s", databaseURLVar)
	}
	pool, err := pgxpool.New(ctx, f.url)
	if err != nil {
		return f.resource, fmt.Errorf("PostgreSQL URL: %w", err)
	}
	defer pool.Close()
	if f.table != "" {
		tbl, err := migrations.ParseTableName(f.table)
		if err != nil {
			return f.table, err
		}
		cols, vals := f.keys.split()
		t, err := sqlguard.NewTable(tbl.Schema, tbl.Name, cols...)
		if err != nil {
			return f.table, err
		}
		return f.table + " " + f.keys.String(), t.Update(ctx, pool, vals, f.token)
	}
	g, err := sqlguard.New(sqlguard.WithSchema(f.schema))
	if err != nil {
		return f.resource, err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return g.Advance(ctx, tx, f.resource, f.token) })
	return "resource " + strconv.Quote(f.resource), err
}

func (f *fenceFlags) advanceSQL(ctx context.Context) (string, error) {
	d, name := dbguard.MySQL, "mysql"
	if f.store == "sqlite" {
		d, name = dbguard.SQLite, "sqlite"
	}
	if f.url == "" {
		return f.resource, fmt.Errorf("no database: pass --url (a DSN, or the SQLite file) or set %s", mysqlURLVar)
	}
	db, err := sql.Open(name, f.url)
	if err != nil {
		return f.resource, err
	}
	defer db.Close()
	if f.table != "" {
		database, table, ok := strings.Cut(f.table, ".")
		if !ok {
			database, table = "", f.table
		}
		cols, vals := f.keys.split()
		t, err := dbguard.NewTable(d, database, table, cols...)
		if err != nil {
			return f.table, err
		}
		return f.table + " " + f.keys.String(), t.Update(ctx, db, vals, f.token)
	}
	g, err := dbguard.New(d, dbguard.WithDatabase(f.schema))
	if err != nil {
		return f.resource, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return f.resource, err
	}
	if err := g.Advance(ctx, tx, f.resource, f.token); err != nil {
		_ = tx.Rollback()
		return "resource " + strconv.Quote(f.resource), err
	}
	return "resource " + strconv.Quote(f.resource), tx.Commit()
}

func (f *fenceFlags) advanceDynamo(ctx context.Context, getenv func(string) string) (string, error) {
	c, done := dynamoClient(getenv, f.url, nil)
	defer done()
	g, err := dynamoguard.New(c, f.table)
	if err != nil {
		return f.table, err
	}
	key := make(map[string]types.AttributeValue, len(f.keys))
	for _, kv := range f.keys {
		if n, ok := strings.CutPrefix(kv.value, "n:"); ok {
			key[kv.col] = &types.AttributeValueMemberN{Value: n}
		} else {
			key[kv.col] = &types.AttributeValueMemberS{Value: kv.value}
		}
	}
	resource := "dynamodb://" + f.table + "/" + f.keys.String()
	return resource, g.Update(ctx, key, f.token, expression.UpdateBuilder{})
}

func (f *fenceFlags) advanceS3(ctx context.Context, getenv func(string) string) (string, error) {
	resource := "s3://" + f.bucket + "/" + f.resource
	cfg, done := awsConfig(getenv, getenv("FENCE_S3_ACCESS_KEY"), getenv("FENCE_S3_SECRET_KEY"), nil)
	defer done()
	c := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if f.url != "" {
			o.BaseEndpoint = aws.String(f.url)
			o.UsePathStyle = true
		}
	})
	g, err := blobguard.New(c, f.bucket)
	if err != nil {
		return resource, err
	}
	obj, err := g.Get(ctx, f.resource)
	if err != nil {
		return resource, err
	}
	_, err = g.PutIf(ctx, f.resource, f.token, strings.NewReader(string(obj.Body)), obj.Version)
	return resource, err
}

// keyList is the value of the repeatable --key COL=VALUE flag.
type keyList []keyValue

type keyValue struct{ col, value string }

func (l *keyList) String() string {
	parts := make([]string, len(*l))
	for i, kv := range *l {
		parts[i] = kv.col + "=" + kv.value
	}
	return strings.Join(parts, ",")
}

func (l *keyList) Set(v string) error {
	col, value, ok := strings.Cut(v, "=")
	if !ok || col == "" {
		return fmt.Errorf("--key %q is not COL=VALUE", v)
	}
	*l = append(*l, keyValue{col, value})
	return nil
}

// split returns the key columns and their values: a value that reads as a
// whole number is passed as an int64, anything else as a string.
func (l keyList) split() ([]string, []any) {
	cols, vals := make([]string, len(l)), make([]any, len(l))
	for i, kv := range l {
		cols[i] = kv.col
		if n, err := strconv.ParseInt(kv.value, 10, 64); err == nil {
			vals[i] = n
		} else {
			vals[i] = kv.value
		}
	}
	return cols, vals
}
