package integration

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/dynamolease"
	"github.com/fencekit/fencekit/lease/etcdlease"
	"github.com/fencekit/fencekit/lease/memlease"
	"github.com/fencekit/fencekit/lease/pglease"
	"github.com/fencekit/fencekit/lease/redislease"
	"github.com/fencekit/fencekit/lease/redislease/redistest"
	"github.com/fencekit/fencekit/lease/zklease"
)

// TestDocsListTheBackendsThatKeepALine: lease's package doc and
// Options.FIFO name exactly the backends whose Limits say they keep
// waiters in line (driver.Limits.Queues). No backend does I/O here: each
// is built and asked its Limits.
func TestDocsListTheBackendsThatKeepALine(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL()) // connects lazily
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}}) // never reached
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()

	queues := map[string]bool{} // package name -> Limits().Queues, in every mode
	add := func(name string, b driver.Backend, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		q, seen := queues[name]
		queues[name] = b.Limits().Queues && (q || !seen)
	}
	add("memlease", memlease.New(), nil)
	rb, err := redislease.New(redistest.Shared(t))
	add("redislease", rb, err)
	defer rb.Close()
	for _, mode := range []pglease.Mode{pglease.ModeTable, pglease.ModeSession} {
		pb, err := pglease.New(pool, pglease.WithMode(mode))
		add("pglease", pb, err)
		defer pb.Close()
	}
	eb, err := etcdlease.New(etcd)
	add("etcdlease", eb, err)
	defer eb.Close()
	zb, err := zklease.New([]string{"127.0.0.1:1"}) // connects in the background; closed at once
	add("zklease", zb, err)
	defer zb.Close()
	db, err := dynamolease.New(dynamodb.New(dynamodb.Options{Region: "us-east-1"}), "leases")
	add("dynamolease", db, err)

	read := func(path, pattern string) string {
		t.Helper()
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(strings.ReplaceAll(string(src), "//", " ")), " ")
		m := regexp.MustCompile(pattern).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("%s: no list of the backends that keep a line (%s)", path, pattern)
		}
		return m[1]
	}
	for _, doc := range []struct{ path, list string }{
		{"../lease/doc.go", read("../lease/doc.go", `Backends that keep a line(?: \(driver\.Limits\.Queues\))?: ([^.(]*)`)},
		{"../lease/options.go", read("../lease/options.go", `\(driver\.Limits\.Queues: ([^;]*);`)},
	} {
		for name, q := range queues {
			if listed := regexp.MustCompile(`\b` + name + `\b`).MatchString(doc.list); listed != q {
				t.Errorf("%s lists %q as keeping a line: %v; its Limits().Queues: %v", doc.path, name, listed, q)
			}
		}
	}
}
