package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/dynamolease"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// The lease stores the command reaches, configured as the library is: a
// URL or address list (or the FENCE_* variable the tests and demos use),
// and the namespace options of each backend.

// Variables naming each store's address.
const (
	redisURLVar      = "FENCE_REDIS_URL"
	etcdEndpointsVar = "FENCE_ETCD_ENDPOINTS"
	zkServersVar     = "FENCE_ZK_SERVERS"
	dynamoEndpoint   = "FENCE_DYNAMODB_ENDPOINT"
)

// Store kinds, as --store names them.
const (
	storeRedis           = "redis"
	storePostgres        = "postgres"
	storePostgresSession = "postgres-session"
	storeEtcd            = "etcd"
	storeZooKeeper       = "zookeeper"
	storeDynamoDB        = "dynamodb"
)

// storeFlags are the flags every lease command takes.
type storeFlags struct {
	store     string
	url       string
	prefix    string // Redis key prefix, etcd prefix, DynamoDB key prefix
	prefixSet bool
	schema    string
	redisMode string
	root      string
	table     string
	keyAttr   string
	timeout   time.Duration
	getenv    func(string) string
	// dial, when set, opens every connection to the store (fencekit
	// verify's workers: a dialer that injects faults).
	dial dialFunc
	// sessionTimeout, when set, is the ZooKeeper session timeout to ask
	// for (zklease's default otherwise).
	sessionTimeout time.Duration
}

// dialFunc opens a network connection, as net.Dialer.DialContext does.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func (s *storeFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	s.getenv = getenv
	fs.StringVar(&s.store, "store", "", "redis, postgres, postgres-session, etcd, zookeeper or dynamodb (default: from the URL's scheme, or the one FENCE_* variable set)")
	fs.StringVar(&s.url, "url", "", "the store's address: a Redis or PostgreSQL URL, etcd endpoints or ZooKeeper servers (comma-separated host:port), a DynamoDB endpoint (default: the store's FENCE_* variable)")
	fs.StringVar(&s.prefix, "prefix", "", "the key prefix (Redis, default fencekit:), etcd prefix (default fencekit/) or DynamoDB key prefix (default none)")
	fs.StringVar(&s.schema, "schema", "", "PostgreSQL: the schema of fencekit's lease tables (default: the search_path)")
	fs.StringVar(&s.redisMode, "redis-mode", "standalone", "Redis: standalone, sentinel (a URL with master_name=) or cluster (a URL with addr= for more nodes)")
	fs.StringVar(&s.root, "root", "", "ZooKeeper: the root of the lease nodes (default /fencekit/leases)")
	fs.StringVar(&s.table, "table", "", "DynamoDB: the lease table (required)")
	fs.StringVar(&s.keyAttr, "key-attribute", "", "DynamoDB: the table's partition key (default name)")
	fs.DurationVar(&s.timeout, "timeout", 30*time.Second, "give up on each request to the store after this long")
}

// kind returns the store to use: --store, or the one the URL's scheme or
// the FENCE_* variables name.
func (s *storeFlags) kind() (string, error) {
	switch s.store {
	case storeRedis, storePostgres, storePostgresSession, storeEtcd, storeZooKeeper, storeDynamoDB:
		return s.store, nil
	case "":
	default:
		return "", fmt.Errorf("unknown --store %q (redis, postgres, postgres-session, etcd, zookeeper or dynamodb)", s.store)
	}
	switch {
	case strings.HasPrefix(s.url, "redis://"), strings.HasPrefix(s.url, "rediss://"):
		return storeRedis, nil
	case strings.HasPrefix(s.url, "postgres://"), strings.HasPrefix(s.url, "postgresql://"):
		return storePostgres, nil
	case s.url != "":
		return "", errors.New("--store is required with this --url")
	}
	var set []string
	for kind, v := range map[string]string{storeRedis: redisURLVar, storePostgres: databaseURLVar, storeEtcd: etcdEndpointsVar, storeZooKeeper: zkServersVar, storeDynamoDB: dynamoEndpoint} {
		if s.getenv(v) != "" {
			set = append(set, kind)
		}
	}
	if len(set) == 1 {
		return set[0], nil
	}
	return "", errors.New("pass --store (redis, postgres, postgres-session, etcd, zookeeper or dynamodb)")
}

// address returns --url, or the store's variable.
func (s *storeFlags) address(kind string) (string, error) {
	if s.url != "" {
		return s.url, nil
	}
	v := map[string]string{storeRedis: redisURLVar, storePostgres: databaseURLVar, storePostgresSession: databaseURLVar,
		storeEtcd: etcdEndpointsVar, storeZooKeeper: zkServersVar, storeDynamoDB: dynamoEndpoint}[kind]
	if a := s.getenv(v); a != "" {
		return a, nil
	}
	if kind == storeDynamoDB {
		return "", nil // the SDK's own endpoint for the configured region
	}
	return "", fmt.Errorf("no address for %s: pass --url or set %s", kind, v)
}

// operator is what the lease commands need of a backend.
type operator interface {
	driver.Backend
	driver.Lister
	driver.Revoker
}

// openStore connects to the store and returns its backend and a function
// that closes everything it opened. ctx bounds the connection.
func (s *storeFlags) openStore(ctx context.Context, log *slog.Logger) (operator, string, func(), error) {
	kind, err := s.kind()
	if err != nil {
		return nil, "", nil, err
	}
	addr, err := s.address(kind)
	if err != nil {
		return nil, kind, nil, err
	}
	if s.prefixSet && kind != storeRedis && kind != storeEtcd && kind != storeDynamoDB {
		return nil, kind, nil, fmt.Errorf("--prefix is for redis, etcd and dynamodb, not %s", kind)
	}
	var b any
	closeAll := func() {}
	switch kind {
	case storeRedis:
		var c redis.UniversalClient
		if c, err = redisClient(s.redisMode, addr, s.dial); err != nil {
			return nil, kind, nil, err
		}
		var opts []redislease.Option
		if s.prefixSet {
			opts = append(opts, redislease.WithPrefix(s.prefix))
		}
		rb, err := redislease.New(c, opts...)
		if err != nil {
			c.Close()
			return nil, kind, nil, err
		}
		b, closeAll = rb, func() { rb.Close(); c.Close() }
	case storePostgres, storePostgresSession:
		pool, err := pgPool(ctx, addr, s.dial)
		if err != nil {
			return nil, kind, nil, err
		}
		mode := pglease.ModeTable
		if kind == storePostgresSession {
			mode = pglease.ModeSession
		}
		pb, err := pglease.New(pool, pglease.WithMode(mode), pglease.WithSchema(s.schema), pglease.WithLogger(log))
		if err != nil {
			pool.Close()
			return nil, kind, nil, err
		}
		b, closeAll = pb, func() { pb.Close(); pool.Close() }
	case storeEtcd:
		cfg := clientv3.Config{Endpoints: splitList(addr), DialTimeout: s.timeout, Logger: zap.NewNop(), Context: ctx}
		if dial := s.dial; dial != nil {
			cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return dial(ctx, "tcp", addr)
			})}
		}
		c, err := clientv3.New(cfg)
		if err != nil {
			return nil, kind, nil, fmt.Errorf("etcd: %w", err)
		}
		var opts []etcdlease.Option
		if s.prefixSet {
			opts = append(opts, etcdlease.WithPrefix(s.prefix))
		}
		eb, err := etcdlease.New(c, opts...)
		if err != nil {
			c.Close()
			return nil, kind, nil, err
		}
		b, closeAll = eb, func() { eb.Close(); c.Close() }
	case storeZooKeeper:
		opts := []zklease.Option{zklease.WithLogger(log), zklease.WithIdentity("fencekit-cli/" + who())}
		if s.root != "" {
			opts = append(opts, zklease.WithRoot(s.root))
		}
		if s.sessionTimeout > 0 {
			opts = append(opts, zklease.WithSessionTimeout(s.sessionTimeout))
		}
		if dial := s.dial; dial != nil {
			opts = append(opts, zklease.WithDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				return dial(ctx, network, addr)
			}))
		}
		zb, err := zklease.New(splitList(addr), opts...)
		if err != nil {
			return nil, kind, nil, err
		}
		if err := zb.Ready(ctx); err != nil {
			zb.Close()
			return nil, kind, nil, fmt.Errorf("ZooKeeper at %s: %w", addr, err)
		}
		b, closeAll = zb, func() { zb.Close() }
	case storeDynamoDB:
		if s.table == "" {
			return nil, kind, nil, errors.New("--table is required with --store dynamodb")
		}
		c, done := dynamoClient(s.getenv, addr, s.dial)
		var opts []dynamolease.Option
		if s.prefixSet {
			opts = append(opts, dynamolease.WithKeyPrefix(s.prefix))
		}
		if s.keyAttr != "" {
			opts = append(opts, dynamolease.WithKeyAttribute(s.keyAttr))
		}
		db, err := dynamolease.New(c, s.table, opts...)
		if err != nil {
			done()
			return nil, kind, nil, err
		}
		b, closeAll = db, done
	}
	op, ok := b.(operator)
	if !ok {
		closeAll()
		return nil, kind, nil, fmt.Errorf("the %s backend cannot list or revoke leases", kind)
	}
	return op, kind, closeAll, nil
}

// redisClient opens a go-redis client for mode and URL, whose connections
// dial opens (the client's own dialer when nil).
func redisClient(mode, url string, dial dialFunc) (redis.UniversalClient, error) {
	switch mode {
	case "standalone", "":
		o, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("the Redis URL: %w", err)
		}
		o.ContextTimeoutEnabled, o.Dialer = true, dial
		return redis.NewClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(url)
		if err != nil {
			return nil, fmt.Errorf("the Redis Sentinel URL (redis://sentinel:26379?master_name=NAME&addr=...): %w", err)
		}
		o.ContextTimeoutEnabled, o.Dialer = true, dial
		return redis.NewFailoverClient(o), nil
	case "cluster":
		o, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, fmt.Errorf("the Redis Cluster URL (redis://node1:6379?addr=node2:6379): %w", err)
		}
		o.ContextTimeoutEnabled, o.Dialer = true, dial
		return redis.NewClusterClient(o), nil
	}
	return nil, fmt.Errorf("unknown --redis-mode %q (standalone, sentinel or cluster)", mode)
}

// awsConfig is the AWS configuration of the command: credentials from
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN (or the
// given keys), the region from AWS_REGION (default us-east-1), and an HTTP
// transport of its own, whose connections dial opens (when not nil) and
// done closes. Profiles and single sign-on are not read: export the keys.
func awsConfig(getenv func(string) string, ak, sk string, dial dialFunc) (cfg aws.Config, done func()) {
	region := getenv("AWS_REGION")
	if region == "" {
		region = "us-east-1"
	}
	token := ""
	if ak == "" || sk == "" {
		ak, sk, token = getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_SECRET_ACCESS_KEY"), getenv("AWS_SESSION_TOKEN")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if dial != nil {
		tr.DialContext = dial
	}
	return aws.Config{Region: region, HTTPClient: &http.Client{Transport: tr},
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			if ak == "" || sk == "" {
				return aws.Credentials{}, errors.New("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
			}
			return aws.Credentials{AccessKeyID: ak, SecretAccessKey: sk, SessionToken: token, Source: "fencekit environment"}, nil
		})}, tr.CloseIdleConnections
}

// dynamoClient is a DynamoDB client with awsConfig and, when endpoint is
// set, that endpoint; done closes its connections.
func dynamoClient(getenv func(string) string, endpoint string, dial dialFunc) (c *dynamodb.Client, done func()) {
	cfg, done := awsConfig(getenv, "", "", dial)
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	}), done
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// pgPool opens a pgx pool for url, whose connections dial opens (pgx's own
// dialer when nil).
func pgPool(ctx context.Context, url string, dial dialFunc) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL URL: %w", err)
	}
	if dial != nil {
		cfg.ConnConfig.DialFunc = pgconn.DialFunc(dial)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL URL: %w", err)
	}
	return pool, nil
}
