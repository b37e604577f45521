package zklease_test

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fencekit/fencekit/internal/testkit/pairbench"
	"github.com/fencekit/fencekit/internal/testkit/zktest"
	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/zklease"
)

// zkOps names the request types of ZooKeeper's protocol that a lease's
// life sends; others are counted as "op<N>".
var zkOps = map[int32]string{
	1: "create", 2: "delete", 3: "exists", 4: "getData", 8: "getChildren", 9: "sync",
	11: "ping", 12: "getChildren2", 14: "multi", 15: "create2", 19: "createContainer",
	-11: "closeSession", 101: "setWatches",
}

// zkRequests counts the requests a client writes to its connections, by
// type, from the frames of the protocol (a 4-byte length, then, after a
// connection's first frame, which is the session's handshake, a 4-byte
// xid and a 4-byte type).
type zkRequests struct {
	mu sync.Mutex
	n  map[string]int64
}

func (z *zkRequests) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &zkCountingConn{Conn: c, z: z}, nil
}

// counts returns the requests counted so far, by type.
func (z *zkRequests) counts() map[string]int64 {
	z.mu.Lock()
	defer z.mu.Unlock()
	return maps.Clone(z.n)
}

type zkCountingConn struct {
	net.Conn
	z       *zkRequests
	mu      sync.Mutex
	pending []byte // the start of a frame not yet written whole
	frames  int
}

func (c *zkCountingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.pending = append(c.pending, p...)
	for len(c.pending) >= 4 {
		size := int(binary.BigEndian.Uint32(c.pending))
		if len(c.pending) < 4+size {
			break
		}
		kind := "connect"
		if c.frames > 0 && size >= 8 {
			op := int32(binary.BigEndian.Uint32(c.pending[8:]))
			var ok bool
			if kind, ok = zkOps[op]; !ok {
				kind = fmt.Sprintf("op%d", op)
			}
		}
		c.frames++
		c.pending = c.pending[4+size:]
		c.z.mu.Lock()
		if c.z.n == nil {
			c.z.n = map[string]int64{}
		}
		c.z.n[kind]++
		c.z.mu.Unlock()
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// BenchmarkRenewLoad is the requests of keeping leases alive on a
// 3-member ensemble through one follower, as bench's BenchmarkPGRenewLoad
// measures them on PostgreSQL (pairbench.RenewLoad: 1,000 leases held by
// one lease.Manager with its defaults at TTL 15 s, over a window of b.N
// seconds; run it with -benchtime 10x). The session timeout is the TTL:
// the backend refuses a TTL longer than its session's. The requests are counted on the client's connection,
// by type.
//
// Metrics, per 1,000 held leases: reqs/s, renewals/s, and exists/s (or
// whichever read a renewal sends), ping/s (the session's, one connection
// whatever the number of leases) and any other type.
func BenchmarkRenewLoad(b *testing.B) {
	ens := zktest.Start(b, 3, zktest.Config{})
	member := []string{follower(b, ens).Addr()}
	z := &zkRequests{}
	be := newBackend(b, member, zklease.WithRoot(zktest.Root(b)), zklease.WithSessionTimeout(pairbench.RenewTTL), zklease.WithDialer(z.dial))
	renewals := &pairbench.RenewCounter{}
	m, err := lease.NewManager(be, pairbench.RenewTTL, lease.WithObserver(renewals))
	if err != nil {
		b.Fatal(err)
	}
	pairbench.RenewLoad(b, m, renewals, "renew-", 1000, z.counts)
}
