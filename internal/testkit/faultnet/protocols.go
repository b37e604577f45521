package faultnet

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strings"
)

// The framings of the protocols whose replies the tests lose, for a Wire:
// PostgreSQL (sqlguard), MySQL and MariaDB (dbguard), ZooKeeper (zklease)
// and gRPC over HTTP/2 (etcdlease).

// PGWire returns a Wire for a PostgreSQL pool (its Dial is pgx's
// DialFunc) that, once armed, loses the
// reply to the first statement the server completes with cutTag ("UPDATE
// 1": a row written; "COMMIT": a transaction committed): it reads that
// reply to its ReadyForQuery (by then the server has committed it, the
// commit of an implicit transaction included) and loses it all.
func PGWire(cutTag string) *Wire {
	return &Wire{Message: readPGMessage, Cut: func(msg, _ []byte, r io.Reader) (bool, error) {
		if msg[0] != 'C' || strings.TrimRight(string(msg[5:]), "\x00") != cutTag {
			return false, nil
		}
		for msg[0] != 'Z' {
			var err error
			if msg, err = readPGMessage(r); err != nil {
				return false, err
			}
		}
		return true, nil
	}}
}

// readPGMessage reads one backend message: a type byte, a length that
// counts itself, and the body.
func readPGMessage(r io.Reader) ([]byte, error) {
	head := make([]byte, 5)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(head[1:]))
	if n < 4 {
		return nil, fmt.Errorf("faultnet: bad PostgreSQL message length %d", n)
	}
	msg := make([]byte, 1+n)
	copy(msg, head)
	if _, err := io.ReadFull(r, msg[5:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// MySQLWire returns a Wire for a MySQL pool (its Dial is the
// driver's DialFunc) that, once armed, loses the reply to the first
// statement the server completes that matches cut: "write" (an executed
// statement that changed rows: the server has committed it when it
// answers, in autocommit) or "commit" (a COMMIT). It loses the OK packet:
// the server has applied the statement by then.
func MySQLWire(cut string) *Wire {
	return &Wire{Message: readPacket, Cut: func(pkt, last []byte, _ io.Reader) (bool, error) {
		return mysqlCut(cut, pkt, last), nil
	}}
}

const (
	comQuery       = 0x03
	comStmtExecute = 0x17
)

// mysqlCut reports whether pkt (header included) is the OK packet to lose
// after the request last.
func mysqlCut(cut string, pkt, last []byte) bool {
	if len(pkt) < 7 || pkt[4] != 0x00 || pkt[3] != 1 || len(last) < 5 {
		return false // not the first packet of a reply, or not OK
	}
	switch cut {
	case "write":
		affected, _ := lenenc(pkt[5:])
		return last[4] == comStmtExecute && affected >= 1
	case "commit":
		return last[4] == comQuery && strings.ToUpper(strings.TrimSpace(string(last[5:]))) == "COMMIT"
	}
	return false
}

// readPacket reads one MySQL packet: a 3-byte little-endian length, a
// sequence number, the payload.
func readPacket(r io.Reader) ([]byte, error) {
	head := make([]byte, 4)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	n := int(head[0]) | int(head[1])<<8 | int(head[2])<<16
	pkt := make([]byte, 4+n)
	copy(pkt, head)
	if _, err := io.ReadFull(r, pkt[4:]); err != nil {
		return nil, err
	}
	return pkt, nil
}

// lenenc reads a length-encoded integer.
func lenenc(b []byte) (uint64, error) {
	if len(b) == 0 {
		return 0, fmt.Errorf("empty")
	}
	switch b[0] {
	case 0xfc:
		if len(b) < 3 {
			return 0, fmt.Errorf("short")
		}
		return uint64(binary.LittleEndian.Uint16(b[1:])), nil
	case 0xfd:
		if len(b) < 4 {
			return 0, fmt.Errorf("short")
		}
		return uint64(b[1]) | uint64(b[2])<<8 | uint64(b[3])<<16, nil
	case 0xfe:
		if len(b) < 9 {
			return 0, fmt.Errorf("short")
		}
		return binary.LittleEndian.Uint64(b[1:]), nil
	}
	return uint64(b[0]), nil
}

// ZooKeeper returns a Wire for a go-zookeeper client (its DialTimeout is
// the client's dialer) that, once armed, loses the reply to the next
// request whose opcode is one of ops: the request goes out, the server
// applies it, and the reply that carries the request's xid is lost (watch
// events and pings that come before it pass).
func ZooKeeper(ops ...int32) *Wire {
	return &Wire{
		Message: readZKFrame,
		Request: func(b []byte) bool {
			// go-zookeeper writes each request whole: length, xid,
			// opcode, body. The connect request, first on a connection,
			// has its protocol version (0) where a request's xid (from
			// 1) stands.
			if len(b) < 12 || int32(binary.BigEndian.Uint32(b[4:8])) <= 0 {
				return false
			}
			return slices.Contains(ops, int32(binary.BigEndian.Uint32(b[8:12])))
		},
		Cut: func(msg, req []byte, _ io.Reader) (bool, error) {
			// A reply: length, xid, zxid, error, body.
			return len(msg) >= 8 && bytes.Equal(msg[4:8], req[4:8]), nil
		},
	}
}

// readZKFrame reads one ZooKeeper frame: a 4-byte big-endian length and
// the body.
func readZKFrame(r io.Reader) ([]byte, error) {
	head := make([]byte, 4)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head)
	if n > 64<<20 {
		return nil, fmt.Errorf("faultnet: bad ZooKeeper frame length %d", n)
	}
	msg := make([]byte, 4+int(n))
	copy(msg, head)
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

// HTTP/2 frame types.
const (
	h2Data    = 0x0
	h2Headers = 0x1
)

// h2Preface is what an HTTP/2 client sends first on a connection.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// GRPC returns a Wire for a gRPC client over HTTP/2 in cleartext (an etcd
// client) that, once armed, loses the reply to the next call whose request
// message contains match: it finds the DATA frame that carries match in a
// write of the client, and cuts at the server's first frame on that
// stream, which the server sends once its handler has returned. Every
// call carrying match that the client writes on a connection once armed
// is a candidate (Multiplexed): the first reply to any of them is lost.
func GRPC(match []byte) *Wire {
	return &Wire{
		Message:     readH2Frame,
		Multiplexed: true,
		Request: func(b []byte) bool {
			_, ok := h2StreamOf(b, match)
			return ok
		},
		Cut: func(msg, req []byte, _ io.Reader) (bool, error) {
			id, _ := h2StreamOf(req, match)
			typ := msg[3]
			return (typ == h2Headers || typ == h2Data) && h2Stream(msg) == id, nil
		},
	}
}

// h2StreamOf returns the stream of the first DATA frame in b (frames a
// client wrote, the connection preface perhaps before them) whose payload
// contains match.
func h2StreamOf(b, match []byte) (uint32, bool) {
	b = bytes.TrimPrefix(b, []byte(h2Preface))
	for len(b) >= 9 {
		end := min(9+h2Length(b), len(b))
		if b[3] == h2Data && bytes.Contains(b[9:end], match) {
			return h2Stream(b), true
		}
		b = b[end:]
	}
	return 0, false
}

func h2Length(frame []byte) int {
	return int(frame[0])<<16 | int(frame[1])<<8 | int(frame[2])
}

func h2Stream(frame []byte) uint32 {
	return binary.BigEndian.Uint32(frame[5:9]) & 0x7fffffff
}

// readH2Frame reads one HTTP/2 frame: a 9-byte header (length, type,
// flags, stream) and the payload.
func readH2Frame(r io.Reader) ([]byte, error) {
	head := make([]byte, 9)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, err
	}
	msg := make([]byte, 9+h2Length(head))
	copy(msg, head)
	if _, err := io.ReadFull(r, msg[9:]); err != nil {
		return nil, err
	}
	return msg, nil
}
