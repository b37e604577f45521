// Package testenv tells tests, examples and demos where the services are.
// Each address comes from its environment variable (docs/design.md, "Tests
// against real stores") or falls back to the default of the development
// machines.
package testenv

import (
	"net/url"
	"os"
)

// Environment variable names and their defaults.
const (
	PostgresURLVar     = "FENCE_POSTGRES_URL"
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

	RedisURLVar     = "FENCE_REDIS_URL"
	DefaultRedisURL = "redis://127.0.0.1:6379/0"

	S3EndpointVar  = "FENCE_S3_ENDPOINT"
	S3AccessKeyVar = "FENCE_S3_ACCESS_KEY"
	S3SecretKeyVar = "FENCE_S3_SECRET_KEY"
	S3BucketVar    = "FENCE_S3_BUCKET"

	// MariaDB or MySQL, a go-sql-driver DSN: the development machines run
	// MariaDB (Debian has no Oracle MySQL server).
	MySQLURLVar     = "FENCE_MYSQL_URL"
	DefaultMySQLURL = "root@tcp(127.0.0.1:3306)/test"
)

// PostgresURL returns FENCE_POSTGRES_URL or the default.
func PostgresURL() string { return get(PostgresURLVar, DefaultPostgresURL) }

// ReadOnlyPostgresURL returns PostgresURL with every transaction of the
// session read-only (default_transaction_read_only=on), connecting as
// role when role is not empty. It fails only on a PostgresURL that does
// not parse.
func ReadOnlyPostgresURL(role string) (string, error) {
	u, err := url.Parse(PostgresURL())
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("default_transaction_read_only", "on")
	u.RawQuery = q.Encode()
	if role != "" {
		u.User = url.User(role)
	}
	return u.String(), nil
}

// RedisURL returns FENCE_REDIS_URL or the default.
func RedisURL() string { return get(RedisURLVar, DefaultRedisURL) }

// MySQLURL returns FENCE_MYSQL_URL or the default.
func MySQLURL() string { return get(MySQLURLVar, DefaultMySQLURL) }

// S3 holds the S3-compatible store's settings. Endpoint is empty when
// FENCE_S3_ENDPOINT is not set.
type S3 struct {
	Endpoint, AccessKey, SecretKey, Bucket string
}

// S3Config returns the S3 settings from the environment (no defaults: the
// server is started by scripts/services.sh, which exports them).
func S3Config() S3 {
	return S3{
		Endpoint:  os.Getenv(S3EndpointVar),
		AccessKey: os.Getenv(S3AccessKeyVar),
		SecretKey: os.Getenv(S3SecretKeyVar),
		Bucket:    os.Getenv(S3BucketVar),
	}
}

func get(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
