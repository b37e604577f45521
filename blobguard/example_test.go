package blobguard_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"strings"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// The holder of token 41 writes a report; the holder of token 42 (granted
// after 41's lease expired) reads it, changes it and writes it back in one
// request; then 41 wakes up from a long pause and tries to write. The
// store refuses it, and the newer write stands.
func Example() {
	ctx := context.Background()
	// Any *s3.Client: here one for the test server (FENCE_S3_ENDPOINT).
	client := rawClient(baseTransport)
	guard, err := blobguard.New(client, s3env.Bucket)
	if err != nil {
		log.Fatal(err)
	}
	key := exampleKey("reports/daily.json")

	v, err := guard.Put(ctx, key, 41, strings.NewReader(`{"rows":1}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("41 wrote, stored token", v.Token())

	obj, err := guard.Get(ctx, key)
	if err != nil {
		log.Fatal(err)
	}
	body := bytes.Replace(obj.Body, []byte("1"), []byte("2"), 1)
	if _, err := guard.PutIf(ctx, key, 42, bytes.NewReader(body), obj.Version); err != nil {
		log.Fatal(err)
	}
	fmt.Println("42 read token", obj.Token(), "and wrote", string(body))

	_, err = guard.Put(ctx, key, 41, strings.NewReader(`{"rows":0}`))
	if se, ok := fence.AsStale(err); ok {
		fmt.Println("41 refused:", errors.Is(err, fence.ErrStaleToken), "presented", se.Presented, "current", se.Current)
	}

	obj, err = guard.Get(ctx, key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stored:", string(obj.Body), "token", obj.Token())

	// Delete is fenced too, and leaves a tombstone that keeps the token.
	if _, err := guard.Delete(ctx, key, 41); errors.Is(err, fence.ErrStaleToken) {
		fmt.Println("41 cannot delete it")
	}
	if _, err := guard.Delete(ctx, key, 42); err != nil {
		log.Fatal(err)
	}
	_, err = guard.Get(ctx, key)
	fmt.Println("after 42 deleted it:", errors.Is(err, fence.ErrNotFound))
	// Output:
	// 41 wrote, stored token 41
	// 42 read token 41 and wrote {"rows":2}
	// 41 refused: true presented 41 current 42
	// stored: {"rows":2} token 42
	// 41 cannot delete it
	// after 42 deleted it: true
}

// exampleKey makes the example's key unique per run, as a shared test
// bucket needs.
func exampleKey(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("example/%x/%s", b, name)
}
