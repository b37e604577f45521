package blobguard_test

import (
	"bytes"
	"crypto/rand"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/internal/pairbench"
)

// benchSizes are the object sizes the benchmarks write.
var benchSizes = []struct {
	name string
	n    int
}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}}

// benchWrites returns, for a body and one client, the writes the
// benchmarks compare. Each mode makes its step for one key:
//
//   - plain: a PutObject;
//   - cold: Put (the guard reads the whole object first and checks its
//     MD5);
//   - cold-header: Put with Options.HeaderReads (it reads the 30-byte
//     header only);
//   - rmw: PutIf with the version of the previous write (one request).
func benchWrites(b *testing.B, client *s3.Client, body []byte) (modes []string, step func(b *testing.B, mode, key string) func() error) {
	g := newGuard(b, client)
	gh := newGuard(b, client, blobguard.WithHeaderReads())
	step = func(b *testing.B, mode, key string) func() error {
		ctx := b.Context()
		switch mode {
		case "plain":
			return func() error {
				_, err := client.PutObject(ctx, &s3.PutObjectInput{
					Bucket: aws.String(s3env.Bucket), Key: aws.String(key), Body: bytes.NewReader(body),
				})
				return err
			}
		case "cold", "cold-header":
			guard := map[string]*blobguard.Guard{"cold": g, "cold-header": gh}[mode]
			return func() error {
				_, err := guard.Put(ctx, key, 1, bytes.NewReader(body))
				return err
			}
		default: // rmw
			v, err := g.Put(ctx, key, 1, bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			return func() error {
				var err error
				v, err = g.PutIf(ctx, key, 1, bytes.NewReader(body), v)
				return err
			}
		}
	}
	return []string{"plain", "cold", "cold-header", "rmw"}, step
}

func randomBody(n int) []byte {
	body := make([]byte, n)
	_, _ = rand.Read(body)
	return body
}

// BenchmarkPut compares, against the real server in one run, a plain
// PutObject with the fenced writes of the same bytes of benchWrites, one
// sub-benchmark after the other. reqs/op counts HTTP requests.
//
//	TMPDIR=/dev/shm ./scripts/s3server.sh run go test -run '^$' -bench . -count 6 ./blobguard/ | tee bench/blobguard.txt
//	benchstat -col /mode bench/blobguard.txt
//
// (TMPDIR=/dev/shm keeps the server's data on tmpfs, away from disk
// writeback, which otherwise dominates the run-to-run noise.)
func BenchmarkPut(b *testing.B) {
	for _, size := range benchSizes {
		ct := &countingTransport{next: newTransport(b)}
		modes, step := benchWrites(b, rawClient(ct), randomBody(size.n))
		for _, mode := range modes {
			b.Run("size="+size.name+"/mode="+mode, func(b *testing.B) {
				op := step(b, mode, uniqueKey(b, "obj"))
				b.SetBytes(int64(size.n))
				ct.reset()
				ops := 0
				for b.Loop() {
					if err := op(); err != nil {
						b.Fatal(err)
					}
					ops++
				}
				b.ReportMetric(float64(ct.all.Load())/float64(ops), "reqs/op")
			})
		}
	}
}

// BenchmarkPutPaired measures the fenced writes of BenchmarkPut the way
// bench's BenchmarkGuardPaired measures sqlguard: every fenced write is
// paired with a plain PutObject of the same bytes, operation by operation,
// in alternating order, each timed on its own, on one client and server.
// On a shared machine, runs of a benchmark seconds apart differ by 10–40%
// here; two writes milliseconds apart see the same machine.
//
// ns/op is the fenced write's mean time; plain-ratio is that over the
// interleaved plain writes' mean; over-plain-ns/op is the difference.
//
//	TMPDIR=/dev/shm ./scripts/s3server.sh run go test -run '^$' -bench PutPaired -count 6 ./blobguard/ | tee bench/blobguard-paired.txt
//	benchstat -col /mode bench/blobguard-paired.txt
func BenchmarkPutPaired(b *testing.B) {
	for _, size := range benchSizes {
		modes, step := benchWrites(b, rawClient(newTransport(b)), randomBody(size.n))
		for _, mode := range modes[1:] {
			b.Run("size="+size.name+"/mode="+mode, func(b *testing.B) {
				fenced, plain := step(b, mode, uniqueKey(b, "fenced")), step(b, "plain", uniqueKey(b, "plain"))
				plainT, fencedT, n := pairbench.Alternate(b, func(int) error { return plain() }, func(int) error { return fenced() })
				pairbench.ReportAlternate(b, "plain", plainT, fencedT, n)
			})
		}
	}
}
