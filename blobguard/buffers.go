package blobguard

import (
	"fmt"
	"github.com/fencekit/fencekit/fence"
	"io"
	"sync"
)

// Buffers for the stored form of objects. A fresh multi-megabyte buffer
// per write costs more than the copy into it (page faults and GC work on
// memory the runtime handed back to the OS: +25% on a 1 MiB write to a
// loopback server), so buffers the guard no longer needs go back to a pool:
// a read only the guard looked at, and the body of a write the store
// acknowledged. An acknowledged body has been read to its end (the store
// received every byte), and aws-sdk-go-v2 closes its wrapper around a
// request body, under a lock shared with its reads, before PutObject
// returns, so nothing reads it afterwards. A body whose request failed is
// left to the GC, in case a Client other than *s3.Client still reads it.
var bufPool sync.Pool // of *[]byte

// maxPooled bounds the buffers kept for reuse, in bytes.
const maxPooled = 16 << 20

// getBuf returns a slice of length n, from the pool if one is big enough.
func getBuf(n int) []byte {
	if p, ok := bufPool.Get().(*[]byte); ok {
		if cap(*p) >= n {
			return (*p)[:n]
		}
		bufPool.Put(p)
	}
	return make([]byte, n)
}

// putBuf hands b back for reuse; nothing may use it afterwards.
func putBuf(b []byte) {
	if b != nil && cap(b) <= maxPooled {
		bufPool.Put(&b)
	}
}

// readAll reads r to its end. size is the expected length (-1 if unknown),
// limit the most bytes accepted (more is an error wrapping fence.ErrInvalidArgument),
// and pooled says whether the buffer may come from the pool.
func readAll(r io.Reader, size, limit int64, pooled bool) ([]byte, error) {
	if size < 0 || size > limit {
		size = 512
	}
	var b []byte
	if pooled {
		b = getBuf(int(size) + 1)[:0]
	} else {
		b = make([]byte, 0, size+1)
	}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return nil, fmt.Errorf("%w: more than %d bytes", fence.ErrInvalidArgument, limit)
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
