package zklease

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Ending a session whose answers never arrive.
//
// go-zookeeper gives up on a connection that has not answered for two
// thirds of the session timeout, and reconnects in the same session. A
// client whose requests reach the server later than that hears no answer
// at all, yet its requests are applied, and its reconnects keep its session
// alive at the store: a create whose answer it never hears can leave a
// node at the head of a lease's queue, under a name the backend never
// learns (ZooKeeper names a sequential node in the answer), which nothing
// would delete. findCreated then ends the session at the store, blind:
// over a connection of its own, it sends a connect request that takes the
// session over and a close request, and needs neither answer. Each arrives
// as late as the client's other requests, and the ensemble deletes every
// ephemeral node of the session when it applies the close.

// endSessionBlind ends session id at the store (see above) if the client is
// still on it. It does not while a grant of the session may still be valid
// to its holder (its TTL has not passed since the send time of the last
// request that confirmed it): it then returns how long to wait before
// trying again. From the moment it decides to end the session, no grant is
// made or renewed on it (checkSession), so no holder can read valid a grant
// whose node the close deletes. It returns 0 when done or not needed.
func (b *Backend) endSessionBlind(id int64) time.Duration {
	b.mu.Lock()
	if b.isClosed || id == 0 || b.session != id {
		b.mu.Unlock()
		return 0
	}
	if b.doomed != id {
		var wait time.Duration
		for _, ns := range b.names {
			for _, rec := range ns.grants {
				if rec.session == id && !rec.ended {
					wait = max(wait, time.Until(rec.base.Add(rec.ttl)))
				}
			}
		}
		if wait > 0 {
			b.mu.Unlock()
			return wait + time.Millisecond
		}
		b.doomed = id
	} else if time.Since(b.doomedAt) < b.o.SessionTimeout {
		// Sent already; send again only if the session outlives it.
		b.mu.Unlock()
		return b.o.SessionTimeout - time.Since(b.doomedAt)
	}
	b.doomedAt = time.Now()
	server, passwd, timeout := b.server, append([]byte(nil), b.passwd...), b.o.SessionTimeout
	b.wg.Add(1)
	b.mu.Unlock()
	b.log.Warn("zklease: no answer from the ensemble to a create whose node this backend cannot name; ending the session at the store", "session", sessionHex(id), "server", server)
	go func() {
		defer b.wg.Done()
		b.closeSessionAt(server, id, passwd, timeout)
	}()
	return timeout
}

// closeSessionAt sends a connect request for session id and a close
// request to server, in one write, and keeps the connection open until the
// server closes it, timeout passes or the backend is closed.
func (b *Backend) closeSessionAt(server string, id int64, passwd []byte, timeout time.Duration) {
	c, err := b.o.Dialer("tcp", server, timeout)
	if err != nil {
		b.log.Warn("zklease: cannot reach the server to end the session", "session", sessionHex(id), "server", server, "err", err)
		return
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-b.closed:
		}
		_ = c.Close()
	}()
	// ConnectRequest (jute): protocolVersion int32, lastZxidSeen int64,
	// timeOut int32, sessionId int64, passwd buffer, readOnly bool.
	req := binary.BigEndian.AppendUint32(nil, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, uint32(timeout.Milliseconds()))
	req = binary.BigEndian.AppendUint64(req, uint64(id))
	req = binary.BigEndian.AppendUint32(req, uint32(len(passwd)))
	req = append(req, passwd...)
	req = append(req, 0)
	// CloseSession: request header xid int32, type int32 (opClose, -11).
	cl := binary.BigEndian.AppendUint32(nil, 1)
	cl = binary.BigEndian.AppendUint32(cl, uint32(0xfffffff5))
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(req)))
	msg = append(msg, req...)
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(cl)))
	msg = append(msg, cl...)
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(msg); err != nil {
		b.log.Warn("zklease: cannot send the end of the session", "session", sessionHex(id), "server", server, "err", err)
		return
	}
	buf := make([]byte, 512)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

func sessionHex(id int64) string { return fmt.Sprintf("0x%x", id) }
