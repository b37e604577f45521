package blobguard

import (
	"fmt"
	"strings"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/names"
)

// maxKeyLen is S3's limit on an object key, in bytes of UTF-8.
const maxKeyLen = 1024

// validateKey rejects, before any I/O, keys that S3 refuses (empty, longer
// than 1024 bytes, not UTF-8) and keys that S3-compatible stores and SDKs
// are known to rewrite into another key: control characters, empty path
// segments (a leading or trailing "/", "//") and "." or ".." segments.
// Those are refused because a fenced write must land on exactly the key
// that was named (versitygw's posix backend, for one, stores "a//b" and
// "a/b" in the same file).
func validateKey(key string) error {
	if err := names.Check(fence.ErrInvalidArgument, "key", key, names.Rules{Max: maxKeyLen, NoControl: true}); err != nil {
		return err
	}
	for _, seg := range strings.Split(key, "/") {
		switch seg {
		case "":
			return fmt.Errorf("%w: key %q has an empty path segment (leading, trailing or double \"/\")", fence.ErrInvalidArgument, key)
		case ".", "..":
			return fmt.Errorf("%w: key %q has a %q path segment", fence.ErrInvalidArgument, key, seg)
		}
	}
	return nil
}

// validateBucket checks the S3 bucket naming rules for new buckets: 3 to 63
// characters of lowercase letters, digits, '.' and '-', starting and ending
// with a letter or digit.
func validateBucket(bucket string) error {
	if bucket == "" {
		return fmt.Errorf("%w: empty bucket name", fence.ErrInvalidArgument)
	}
	if len(bucket) < 3 || len(bucket) > 63 {
		return fmt.Errorf("%w: bucket name %q must be 3 to 63 characters", fence.ErrInvalidArgument, bucket)
	}
	for i := 0; i < len(bucket); i++ {
		c := bucket[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && c != '.' && c != '-' {
			return fmt.Errorf("%w: bucket name %q: character %q not allowed", fence.ErrInvalidArgument, bucket, c)
		}
		if !alnum && (i == 0 || i == len(bucket)-1) {
			return fmt.Errorf("%w: bucket name %q must start and end with a letter or digit", fence.ErrInvalidArgument, bucket)
		}
	}
	return nil
}

func validateToken(t fence.Token) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("blobguard: %w", err)
	}
	return nil
}
