package blobguard_test

import (
	"bytes"
	"crypto/rand"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// BenchmarkPut compares, against the real server in one run, a plain
// PutObject with a fenced write of the same bytes: cold (Put: the guard
// reads the object first) and read-modify-write (PutIf with the version
// of the previous write: one request). reqs/op counts HTTP requests.
//
//	TMPDIR=/dev/shm ./scripts/s3server.sh run go test -run '^$' -bench . -count 6 ./blobguard/ | tee bench/blobguard.txt
//	benchstat -col /mode bench/blobguard.txt
//
// (TMPDIR=/dev/shm keeps the server's data on tmpfs, away from disk
// writeback, which otherwise dominates the run-to-run noise.)
func BenchmarkPut(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}} {
		body := make([]byte, size.n)
		_, _ = rand.Read(body)
		ct := &countingTransport{next: newTransport(b)}
		client := rawClient(ct)
		g := newGuard(b, client)

		run := func(mode string, op func(b *testing.B, key string) func() error) {
			b.Run("size="+size.name+"/mode="+mode, func(b *testing.B) {
				key := uniqueKey(b, "obj")
				step := op(b, key)
				b.SetBytes(int64(size.n))
				ct.reset()
				ops := 0
				for b.Loop() {
					if err := step(); err != nil {
						b.Fatal(err)
					}
					ops++
				}
				b.ReportMetric(float64(ct.all.Load())/float64(ops), "reqs/op")
			})
		}
		run("plain", func(b *testing.B, key string) func() error {
			return func() error {
				_, err := client.PutObject(b.Context(), &s3.PutObjectInput{
					Bucket: aws.String(s3env.Bucket), Key: aws.String(key), Body: bytes.NewReader(body),
				})
				return err
			}
		})
		run("cold", func(b *testing.B, key string) func() error {
			return func() error {
				_, err := g.Put(b.Context(), key, 1, bytes.NewReader(body))
				return err
			}
		})
		run("rmw", func(b *testing.B, key string) func() error {
			v, err := g.Put(b.Context(), key, 1, bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			return func() error {
				var err error
				v, err = g.PutIf(b.Context(), key, 1, bytes.NewReader(body), v)
				return err
			}
		})
	}
}
