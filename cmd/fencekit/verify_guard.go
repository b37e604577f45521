package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/dbguard"
	"github.com/fencekit/fencekit/dynamoguard"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/sqlguard"
)

// The guarded side of fencekit verify: a scratch resource on the user's
// store that the run creates, its workers write through a guard, and the
// run removes. Its name says when the run expected to be done (a later run
// sweeps it after that), so nothing of the user's is touched and a run
// that was killed leaves nothing for long.

// Guard kinds, as --guard names them.
const (
	guardPostgres = "postgres"
	guardMySQL    = "mysql"
	guardSQLite   = "sqlite"
	guardDynamoDB = "dynamodb"
	guardS3       = "s3"
)

// scratchPrefix begins the name of every scratch resource: a table, a
// DynamoDB table, or an S3 key prefix (followed by "/").
const scratchPrefix = "fencekit_verify_"

// scratchGrace is how long after its run's planned end a scratch resource
// is kept from the sweep of later runs.
const scratchGrace = 10 * time.Minute

// scratch is one run's resource: a table (in Schema, the PostgreSQL schema
// or MySQL database or SQLite schema it was created in) or a key prefix,
// and the key of the one row, item or object the workers write.
type scratch struct {
	Schema string `json:"schema,omitempty"`
	Name   string `json:"name"`
	Key    string `json:"key"`
}

// newScratch names a run's resource: the prefix, the Unix second after
// which a later run may sweep it, and random hex.
func newScratch(expires time.Time, random string) scratch {
	return scratch{Name: fmt.Sprintf("%s%d_%s", scratchPrefix, expires.Unix(), random), Key: "verify"}
}

// scratchExpired reports whether name is a scratch resource whose run
// should have ended before now.
func scratchExpired(name string, now time.Time) bool {
	rest, ok := strings.CutPrefix(strings.TrimSuffix(name, "/"), scratchPrefix)
	if !ok {
		return false
	}
	sec, _, ok := strings.Cut(rest, "_")
	n, err := strconv.ParseInt(sec, 10, 64)
	return ok && err == nil && time.Unix(n, 0).Before(now)
}

// guardFlags are the flags that say where the guarded writes go.
type guardFlags struct {
	kind   string
	url    string
	schema string
	bucket string
	getenv func(string) string
}

func (g *guardFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	g.getenv = getenv
	fs.StringVar(&g.kind, "guard", "", "postgres (sqlguard), mysql or sqlite (dbguard), dynamodb (dynamoguard) or s3 (blobguard)")
	fs.StringVar(&g.url, "guard-url", "", "the guard's store: PostgreSQL URL, MySQL DSN, SQLite file, DynamoDB or S3 endpoint")
	fs.StringVar(&g.schema, "guard-schema", "", "PostgreSQL schema, MySQL database or SQLite schema of the scratch table")
	fs.StringVar(&g.bucket, "bucket", getenv("FENCE_S3_BUCKET"), "S3: the bucket of the scratch objects")
}

// resolve fills the guard's kind from the lease store's when it was not
// given, and its address from the environment.
func (g *guardFlags) resolve(storeKind string) error {
	if g.kind == "" {
		switch storeKind {
		case storePostgres, storePostgresSession:
			g.kind = guardPostgres
		case storeDynamoDB:
			g.kind = guardDynamoDB
		default:
			return fmt.Errorf("pass --guard (postgres, mysql, sqlite, dynamodb or s3): %s has no guard of its own", storeKind)
		}
	}
	vars := map[string]string{guardPostgres: databaseURLVar, guardMySQL: mysqlURLVar, guardDynamoDB: dynamoEndpoint, guardS3: "FENCE_S3_ENDPOINT"}
	switch g.kind {
	case guardPostgres, guardMySQL:
		if g.url == "" {
			g.url = g.getenv(vars[g.kind])
		}
		if g.url == "" {
			return fmt.Errorf("no address for the %s guard: pass --guard-url or set %s", g.kind, vars[g.kind])
		}
	case guardSQLite:
		if g.url == "" {
			return errors.New("--guard sqlite needs --guard-url (the database file)")
		}
	case guardDynamoDB, guardS3:
		if g.url == "" {
			g.url = g.getenv(vars[g.kind]) // empty: the SDK's endpoint
		}
		if g.kind == guardS3 && g.bucket == "" {
			return errors.New("--guard s3 needs --bucket (or FENCE_S3_BUCKET)")
		}
	default:
		return fmt.Errorf("unknown --guard %q (postgres, mysql, sqlite, dynamodb or s3)", g.kind)
	}
	return nil
}

// guardStore is the guarded store of a run.
type guardStore interface {
	// desc says what the writes go through, for people.
	desc() string
	// where names a scratch resource, for people.
	where(s scratch) string
	// networked is false for a store the workers reach without a
	// network (SQLite): faults on the guard's connections do nothing.
	networked() bool
	// sweep removes the scratch resources of earlier runs that expired
	// before now, and returns their names.
	sweep(ctx context.Context, now time.Time) ([]string, error)
	// create makes s (filling s.Schema), empty; remove removes it.
	create(ctx context.Context, s *scratch) error
	remove(ctx context.Context, s scratch) error
	// write writes value with token through the guard; read returns the
	// token and value stored (fence.None and "" while nothing is).
	write(ctx context.Context, s scratch, token fence.Token, value string) error
	read(ctx context.Context, s scratch) (fence.Token, string, error)
	close()
}

// open connects to the guard's store; dial, when set, opens its
// connections.
func (g *guardFlags) open(ctx context.Context, dial dialFunc) (guardStore, error) {
	switch g.kind {
	case guardPostgres:
		pool, err := pgPool(ctx, g.url, dial)
		if err != nil {
			return nil, err
		}
		return &pgScratch{pool: pool, schema: g.schema}, nil
	case guardMySQL, guardSQLite:
		return openSQLScratch(g.kind, g.url, g.schema, dial)
	case guardDynamoDB:
		c, done := dynamoClient(g.getenv, g.url, dial)
		return &dynamoScratch{c: c, done: done}, nil
	default:
		cfg, done := awsConfig(g.getenv, g.getenv("FENCE_S3_ACCESS_KEY"), g.getenv("FENCE_S3_SECRET_KEY"), dial)
		c := s3.NewFromConfig(cfg, func(o *s3.Options) {
			if g.url != "" {
				o.BaseEndpoint = aws.String(g.url)
				o.UsePathStyle = true
			}
		})
		return &s3Scratch{c: c, bucket: g.bucket, done: done}, nil
	}
}

// ---- PostgreSQL: sqlguard.Table ---------------------------------------

type pgScratch struct {
	pool   *pgxpool.Pool
	schema string
	mu     sync.Mutex
	tbl    *sqlguard.Table
}

func (p *pgScratch) desc() string    { return "PostgreSQL, sqlguard.Table.Upsert" }
func (p *pgScratch) networked() bool { return true }
func (p *pgScratch) close()          { p.pool.Close() }
func (p *pgScratch) where(s scratch) string {
	return fmt.Sprintf("table %s, row k = %q", pgx.Identifier{s.Schema, s.Name}.Sanitize(), s.Key)
}

// schemaOf returns --guard-schema, or the connection's current schema.
func (p *pgScratch) schemaOf(ctx context.Context) (string, error) {
	if p.schema != "" {
		return p.schema, nil
	}
	var s *string
	if err := p.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&s); err != nil {
		return "", err
	}
	if s == nil {
		return "", errors.New("the search_path names no existing schema: pass --guard-schema")
	}
	return *s, nil
}

func (p *pgScratch) sweep(ctx context.Context, now time.Time) ([]string, error) {
	schema, err := p.schemaOf(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := p.pool.Query(ctx, `SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND starts_with(c.relname, $2)`, schema, scratchPrefix)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var swept []string
	for _, n := range names {
		if scratchExpired(n, now) {
			if err := p.remove(ctx, scratch{Schema: schema, Name: n}); err != nil {
				return swept, err
			}
			swept = append(swept, schema+"."+n)
		}
	}
	return swept, nil
}

func (p *pgScratch) create(ctx context.Context, s *scratch) error {
	schema, err := p.schemaOf(ctx)
	if err != nil {
		return err
	}
	s.Schema = schema
	_, err = p.pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{s.Schema, s.Name}.Sanitize()+
		" (k text PRIMARY KEY, v text NOT NULL, lock_version bigint NOT NULL DEFAULT 0 CHECK (lock_version >= 0))")
	return err
}

func (p *pgScratch) remove(ctx context.Context, s scratch) error {
	_, err := p.pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{s.Schema, s.Name}.Sanitize())
	return err
}

func (p *pgScratch) write(ctx context.Context, s scratch, token fence.Token, value string) error {
	p.mu.Lock()
	if p.tbl == nil {
		t, err := sqlguard.NewTable(s.Schema, s.Name, "k")
		if err != nil {
			p.mu.Unlock()
			return err
		}
		p.tbl = t
	}
	t := p.tbl
	p.mu.Unlock()
	return t.Upsert(ctx, p.pool, []any{s.Key}, token, sqlguard.Col("v", value))
}

func (p *pgScratch) read(ctx context.Context, s scratch) (fence.Token, string, error) {
	var (
		tok int64
		v   string
	)
	err := p.pool.QueryRow(ctx, "SELECT lock_version, v FROM "+pgx.Identifier{s.Schema, s.Name}.Sanitize()+" WHERE k = $1", s.Key).Scan(&tok, &v)
	if errors.Is(err, pgx.ErrNoRows) {
		return fence.None, "", nil
	}
	return fence.Token(tok), v, err
}

// ---- MySQL, MariaDB and SQLite: dbguard.Table ---------------------------

type sqlScratch struct {
	db      *sql.DB
	dialect dbguard.Dialect
	schema  string
	mu      sync.Mutex
	tbl     *dbguard.Table
}

func openSQLScratch(kind, url, schema string, dial dialFunc) (*sqlScratch, error) {
	if kind == guardMySQL {
		cfg, err := mysql.ParseDSN(url)
		if err != nil {
			return nil, fmt.Errorf("the MySQL DSN: %w", err)
		}
		cfg.DialFunc = dial
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		return &sqlScratch{db: sql.OpenDB(c), dialect: dbguard.MySQL, schema: schema}, nil
	}
	// Several worker processes write the file: each waits for the others'
	// write locks (dbguard's documentation).
	dsn := url
	if !strings.HasPrefix(dsn, "file:") {
		dsn = "file:" + dsn
	}
	if !strings.Contains(dsn, "busy_timeout") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + "_pragma=busy_timeout(10000)"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	if schema == "" {
		schema = "main"
	}
	return &sqlScratch{db: db, dialect: dbguard.SQLite, schema: schema}, nil
}

func (q *sqlScratch) desc() string {
	if q.dialect == dbguard.SQLite {
		return "SQLite, dbguard.Table.Upsert"
	}
	return "MySQL/MariaDB, dbguard.Table.Upsert"
}
func (q *sqlScratch) networked() bool { return q.dialect != dbguard.SQLite }
func (q *sqlScratch) close()          { q.db.Close() }
func (q *sqlScratch) where(s scratch) string {
	return fmt.Sprintf("table %s, row k = %q", q.ident(s.Schema, s.Name), s.Key)
}

// ident quotes a qualified name in the dialect.
func (q *sqlScratch) ident(schema, name string) string {
	quote := func(s string) string {
		if q.dialect == dbguard.SQLite {
			return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
		}
		return "`" + strings.ReplaceAll(s, "`", "``") + "`"
	}
	return quote(schema) + "." + quote(name)
}

// schemaOf returns --guard-schema, the DSN's database (MySQL) or main
// (SQLite).
func (q *sqlScratch) schemaOf(ctx context.Context) (string, error) {
	if q.schema != "" {
		return q.schema, nil
	}
	var s sql.NullString
	if err := q.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&s); err != nil {
		return "", err
	}
	if !s.Valid {
		return "", errors.New("the DSN names no database: add one (user@tcp(host:3306)/DATABASE) or pass --guard-schema")
	}
	return s.String, nil
}

func (q *sqlScratch) sweep(ctx context.Context, now time.Time) ([]string, error) {
	schema, err := q.schemaOf(ctx)
	if err != nil {
		return nil, err
	}
	query := "SELECT table_name FROM information_schema.tables WHERE table_schema = ?"
	args := []any{schema}
	if q.dialect == dbguard.SQLite {
		query, args = "SELECT name FROM "+q.ident(schema, "sqlite_master")+" WHERE type = 'table'", nil
	}
	rows, err := q.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		names = append(names, n)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	var swept []string
	for _, n := range names {
		if scratchExpired(n, now) {
			if err := q.remove(ctx, scratch{Schema: schema, Name: n}); err != nil {
				return swept, err
			}
			swept = append(swept, schema+"."+n)
		}
	}
	return swept, nil
}

func (q *sqlScratch) create(ctx context.Context, s *scratch) error {
	schema, err := q.schemaOf(ctx)
	if err != nil {
		return err
	}
	s.Schema = schema
	cols := "(k VARCHAR(64) NOT NULL PRIMARY KEY, v TEXT NOT NULL, lock_version BIGINT UNSIGNED NOT NULL DEFAULT 0)"
	if q.dialect == dbguard.SQLite {
		cols = "(k TEXT PRIMARY KEY, v TEXT NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0)"
	}
	_, err = q.db.ExecContext(ctx, "CREATE TABLE "+q.ident(s.Schema, s.Name)+" "+cols)
	return err
}

func (q *sqlScratch) remove(ctx context.Context, s scratch) error {
	_, err := q.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+q.ident(s.Schema, s.Name))
	return err
}

func (q *sqlScratch) write(ctx context.Context, s scratch, token fence.Token, value string) error {
	q.mu.Lock()
	if q.tbl == nil {
		t, err := dbguard.NewTable(q.dialect, s.Schema, s.Name, "k")
		if err != nil {
			q.mu.Unlock()
			return err
		}
		q.tbl = t
	}
	t := q.tbl
	q.mu.Unlock()
	return t.Upsert(ctx, q.db, []any{s.Key}, token, dbguard.Col("v", value))
}

func (q *sqlScratch) read(ctx context.Context, s scratch) (fence.Token, string, error) {
	var (
		tok uint64
		v   string
	)
	err := q.db.QueryRowContext(ctx, "SELECT lock_version, v FROM "+q.ident(s.Schema, s.Name)+" WHERE k = ?", s.Key).Scan(&tok, &v)
	if errors.Is(err, sql.ErrNoRows) {
		return fence.None, "", nil
	}
	return fence.Token(tok), v, err
}

// ---- DynamoDB: dynamoguard -----------------------------------------------

type dynamoScratch struct {
	c    *dynamodb.Client
	done func()
	mu   sync.Mutex
	g    *dynamoguard.Guard
}

func (d *dynamoScratch) desc() string    { return "DynamoDB, dynamoguard.Guard.Put" }
func (d *dynamoScratch) networked() bool { return true }
func (d *dynamoScratch) close()          { d.done() }
func (d *dynamoScratch) where(s scratch) string {
	return fmt.Sprintf("DynamoDB table %s, item pk = %q", s.Name, s.Key)
}

func (d *dynamoScratch) sweep(ctx context.Context, now time.Time) ([]string, error) {
	var swept []string
	p := dynamodb.NewListTablesPaginator(d.c, &dynamodb.ListTablesInput{})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return swept, err
		}
		for _, n := range out.TableNames {
			if scratchExpired(n, now) {
				if err := d.remove(ctx, scratch{Name: n}); err != nil {
					return swept, err
				}
				swept = append(swept, n)
			}
		}
	}
	return swept, nil
}

func (d *dynamoScratch) create(ctx context.Context, s *scratch) error {
	_, err := d.c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(s.Name),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		return err
	}
	return dynamodb.NewTableExistsWaiter(d.c).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(s.Name)}, 5*time.Minute)
}

func (d *dynamoScratch) remove(ctx context.Context, s scratch) error {
	_, err := d.c.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(s.Name)})
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return nil
	}
	return err
}

func (d *dynamoScratch) guard(s scratch) (*dynamoguard.Guard, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.g == nil {
		g, err := dynamoguard.New(d.c, s.Name)
		if err != nil {
			return nil, err
		}
		d.g = g
	}
	return d.g, nil
}

func (d *dynamoScratch) write(ctx context.Context, s scratch, token fence.Token, value string) error {
	g, err := d.guard(s)
	if err != nil {
		return err
	}
	return g.Put(ctx, map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: s.Key}, "v": &types.AttributeValueMemberS{Value: value}}, token)
}

func (d *dynamoScratch) read(ctx context.Context, s scratch) (fence.Token, string, error) {
	g, err := d.guard(s)
	if err != nil {
		return fence.None, "", err
	}
	item, tok, err := g.Get(ctx, map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: s.Key}})
	if errors.Is(err, fence.ErrNotFound) {
		return fence.None, "", nil
	}
	if err != nil {
		return fence.None, "", err
	}
	v, _ := item["v"].(*types.AttributeValueMemberS)
	if v == nil {
		return tok, "", fmt.Errorf("item pk = %q has no string attribute v", s.Key)
	}
	return tok, v.Value, nil
}

// ---- S3: blobguard ---------------------------------------------------------

type s3Scratch struct {
	c      *s3.Client
	bucket string
	done   func()
	mu     sync.Mutex
	g      *blobguard.Guard
}

func (b *s3Scratch) desc() string    { return "S3, blobguard.Guard.Put" }
func (b *s3Scratch) networked() bool { return true }
func (b *s3Scratch) close()          { b.done() }
func (b *s3Scratch) where(s scratch) string {
	return fmt.Sprintf("s3://%s/%s", b.bucket, b.key(s))
}

// key is the object the workers write: under the run's prefix.
func (b *s3Scratch) key(s scratch) string { return s.Name + "/" + s.Key }

func (b *s3Scratch) sweep(ctx context.Context, now time.Time) ([]string, error) {
	var swept []string
	p := s3.NewListObjectsV2Paginator(b.c, &s3.ListObjectsV2Input{Bucket: aws.String(b.bucket), Prefix: aws.String(scratchPrefix), Delimiter: aws.String("/")})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return swept, err
		}
		for _, cp := range out.CommonPrefixes {
			n := strings.TrimSuffix(aws.ToString(cp.Prefix), "/")
			if scratchExpired(n, now) {
				if err := b.remove(ctx, scratch{Name: n}); err != nil {
					return swept, err
				}
				swept = append(swept, "s3://"+b.bucket+"/"+n+"/")
			}
		}
	}
	return swept, nil
}

func (b *s3Scratch) create(ctx context.Context, s *scratch) error {
	_, err := b.c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(b.bucket)})
	if err != nil {
		return fmt.Errorf("bucket %q: %w", b.bucket, err)
	}
	return nil
}

// remove deletes every object under the run's prefix (the guard's writes
// and its probe's).
func (b *s3Scratch) remove(ctx context.Context, s scratch) error {
	p := s3.NewListObjectsV2Paginator(b.c, &s3.ListObjectsV2Input{Bucket: aws.String(b.bucket), Prefix: aws.String(s.Name + "/")})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, o := range out.Contents {
			if _, err := b.c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(b.bucket), Key: o.Key}); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *s3Scratch) guard(s scratch) (*blobguard.Guard, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.g == nil {
		g, err := blobguard.New(b.c, b.bucket, blobguard.WithProbePrefix(s.Name+"/probe/"))
		if err != nil {
			return nil, err
		}
		b.g = g
	}
	return b.g, nil
}

func (b *s3Scratch) write(ctx context.Context, s scratch, token fence.Token, value string) error {
	g, err := b.guard(s)
	if err != nil {
		return err
	}
	_, err = g.Put(ctx, b.key(s), token, strings.NewReader(value))
	return err
}

func (b *s3Scratch) read(ctx context.Context, s scratch) (fence.Token, string, error) {
	g, err := b.guard(s)
	if err != nil {
		return fence.None, "", err
	}
	obj, err := g.Get(ctx, b.key(s))
	if errors.Is(err, fence.ErrNotFound) {
		return fence.None, "", nil
	}
	if err != nil {
		return fence.None, "", err
	}
	return obj.Token(), string(obj.Body), nil
}
