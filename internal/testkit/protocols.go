package testkit

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"
)

// The framings of the database protocols whose replies the guards' tests
// lose (sqlguard's on PostgreSQL, dbguard's on MySQL and MariaDB), for a
// Wire.

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
		return nil, fmt.Errorf("testkit: bad PostgreSQL message length %d", n)
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
