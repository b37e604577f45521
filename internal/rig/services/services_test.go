package services

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

func TestProvideUsesConfiguredServices(t *testing.T) {
	ctx := context.Background()
	t.Setenv(testenv.S3EndpointVar, "")
	s, err := Provide(ctx, Config{Log: t.Logf})
	if err != nil {
		t.Fatalf("Provide: %v", err)
	}
	defer s.Close()
	if err := pingRedis(ctx, s.RedisURL); err != nil {
		t.Fatalf("Redis at %s: %v", s.RedisURL, err)
	}
	if err := pingPostgres(ctx, s.PostgresURL); err != nil {
		t.Fatalf("PostgreSQL at %s: %v", s.PostgresURL, err)
	}
	if len(s.Used) != 3 || !strings.Contains(s.Used[2], "versitygw") {
		t.Fatalf("Used = %q; want three lines, S3 from a versitygw it started", s.Used)
	}
	// The versitygw it started answers, and stops with Close.
	health := s.S3.Endpoint + "/health"
	if resp, err := http.Get(health); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v", health, err)
	} else {
		resp.Body.Close()
	}
	if err := createBucket(ctx, s.S3); err != nil {
		t.Fatalf("bucket: %v", err)
	}
	s.Close()
	client := http.Client{Timeout: time.Second}
	if resp, err := client.Get(health); err == nil {
		resp.Body.Close()
		t.Fatalf("versitygw still answers after Close")
	}
}

func TestProvideNamesWhatIsMissing(t *testing.T) {
	// An explicit endpoint comes with its keys: without them Provide
	// reports the missing keys, not the unreachable endpoint.
	t.Setenv(testenv.S3AccessKeyVar, "demo")
	t.Setenv(testenv.S3SecretKeyVar, "demo-secret")
	ctx := context.Background()
	_, err := Provide(ctx, Config{RedisURL: "redis://127.0.0.1:1/0", PostgresURL: "postgres://postgres@127.0.0.1:1/test?sslmode=disable", S3Endpoint: "http://127.0.0.1:1"})
	if err == nil {
		t.Fatal("Provide with unreachable explicit addresses succeeded")
	}
	for _, want := range []string{"redis: redis://127.0.0.1:1/0 does not answer", "postgres: postgres://postgres@127.0.0.1:1/test", "s3: http://127.0.0.1:1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestProvideSaysTheServerAnswered: a wrong database name is the server's
// answer, not silence, and the error says so.
func TestProvideSaysTheServerAnswered(t *testing.T) {
	u, err := url.Parse(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/fencekit_no_such_db"
	_, err = Provide(context.Background(), Config{PostgresURL: u.String(), NoS3: true})
	if err == nil {
		t.Fatal("Provide with a database that does not exist succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "answered but refused the connection") || !strings.Contains(msg, `database "fencekit_no_such_db" does not exist`) ||
		strings.Contains(msg, "does not answer") || strings.Contains(msg, "nothing answers") {
		t.Errorf("error %q; want it to say the server answered, and what", msg)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@h:5432/db": "postgres://u:***@h:5432/db",
		"postgres://u@h/db":             "postgres://u@h/db",
		"redis://h:6379/0":              "redis://h:6379/0",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
