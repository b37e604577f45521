package drivertest

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync/atomic"
)

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
