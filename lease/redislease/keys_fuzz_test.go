package redislease_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/redislease"
)

// hashTag is the part of a key Redis Cluster hashes: what lies between
// the first '{' and the first '}' after it, if that is not empty; else the
// whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

// FuzzKeysFor: for any prefix New accepts and any two valid lease names,
// the keys of one name share a hash slot (one hash tag, not empty), and
// two different names never share a key or a tag: whatever braces or
// percent signs a name holds, it cannot reach another lease's keys.
func FuzzKeysFor(f *testing.F) {
	for _, s := range [][3]string{
		{"fencekit:", "jobs", "jobs2"}, {"", "{a}", "%7Ba%7D"}, {"p:", "a}b{c", "a%7Db%7Bc"}, {"p{", "x", "y"},
		{"x}", "x", "y"}, {"app:", "%", "%25"}, {"", "}{", "{}"}, {"a:", "ü", "u"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: KeysFor does no I/O
	f.Cleanup(func() { _ = c.Close() })
	f.Fuzz(func(t *testing.T, prefix, a, b string) {
		be, err := redislease.New(c, redislease.WithPrefix(prefix))
		if strings.ContainsAny(prefix, "{}") {
			if !errors.Is(err, redislease.ErrInvalidOptions) {
				t.Fatalf("prefix %q with a brace: New returned %v, want ErrInvalidOptions", prefix, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("New(prefix %q): %v", prefix, err)
		}
		defer be.Close()
		if lease.ValidateName(a) != nil || lease.ValidateName(b) != nil {
			return
		}
		ka, kb := be.KeysFor(a), be.KeysFor(b)
		for _, k := range []redislease.Keys{ka, kb} {
			tag := hashTag(k.Lease)
			if tag == k.Lease || tag == "" || hashTag(k.Token) != tag || hashTag(k.Channel) != tag {
				t.Fatalf("keys %+v do not share one hash tag", k)
			}
			if !strings.HasPrefix(k.Lease, prefix) || !strings.HasPrefix(k.Token, prefix) || !strings.HasPrefix(k.Channel, prefix) {
				t.Fatalf("keys %+v do not start with the prefix %q", k, prefix)
			}
		}
		if a != b {
			if ka.Lease == kb.Lease || ka.Token == kb.Token || ka.Channel == kb.Channel || hashTag(ka.Lease) == hashTag(kb.Lease) {
				t.Fatalf("names %q and %q share keys: %+v and %+v", a, b, ka, kb)
			}
		}
	})
}
