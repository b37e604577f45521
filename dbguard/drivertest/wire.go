package drivertest

import (
	"context"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"github.com/fencekit/fencekit/internal/testkit"
)

// MySQLWire returns a testkit.Wire for a MySQL pool (its Dial is the
// driver's DialFunc) that, once armed, loses the reply to the first
// statement the server completes that matches cut: "write" (an executed
// statement that changed rows: the server has committed it when it
// answers, in autocommit) or "commit" (a COMMIT). It loses the OK packet:
// the server has applied the statement by then.
func MySQLWire(cut string) *testkit.Wire {
	return &testkit.Wire{Message: readPacket, Cut: func(pkt, last []byte, _ io.Reader) (bool, error) {
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

// CountingConnector wraps a driver.Connector and counts the statements its
// connections run (exec, query, prepare, begin): for SQLite, where
// nothing crosses a network, "a request" is a call into the database.
type CountingConnector struct {
	driver.Connector
	Calls atomic.Int64
}

// Connect returns a counting connection.
func (c *CountingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countConn{Conn: conn, n: &c.Calls}, nil
}

type countConn struct {
	driver.Conn
	n *atomic.Int64
}

var errNotSupported = errors.New("drivertest: the wrapped driver lacks this interface")

func (c *countConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.n.Add(1)
	if e, ok := c.Conn.(driver.ExecerContext); ok {
		return e.ExecContext(ctx, q, args)
	}
	return nil, driver.ErrSkip
}

func (c *countConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.n.Add(1)
	if e, ok := c.Conn.(driver.QueryerContext); ok {
		return e.QueryContext(ctx, q, args)
	}
	return nil, driver.ErrSkip
}

func (c *countConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	c.n.Add(1)
	if e, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return e.PrepareContext(ctx, q)
	}
	return c.Conn.Prepare(q)
}

func (c *countConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.n.Add(1)
	if e, ok := c.Conn.(driver.ConnBeginTx); ok {
		return e.BeginTx(ctx, opts)
	}
	return nil, errNotSupported
}

func (c *countConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *countConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}
