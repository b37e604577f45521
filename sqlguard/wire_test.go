package sqlguard_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// wire wraps the TCP connections of a pgx connection or pool to watch
// what the client sends: it counts round trips (a write that follows a
// read starts one), and it can drop PostgreSQL cancel requests, as a
// pooler or a firewall may, so that a statement the client gave up on
// runs to its end on the server.
type wire struct {
	dropCancels bool
	trips       atomic.Int64
}

// cancelRequestCode is the protocol's CancelRequest code (1234 << 16 |
// 5678), bytes 4 to 8 of the first message on a cancel connection.
var cancelRequestCode = []byte{0x04, 0xd2, 0x16, 0x2e}

func (w *wire) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{KeepAlive: 5 * time.Minute}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &wireConn{Conn: c, w: w}, nil
}

// RoundTrips returns the number of round trips so far.
func (w *wire) RoundTrips() int64 { return w.trips.Load() }

type wireConn struct {
	net.Conn
	w      *wire
	read   atomic.Bool // a read happened since the last write
	writes atomic.Int64
}

func (c *wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.read.Store(true)
	}
	return n, err
}

func (c *wireConn) Write(p []byte) (int, error) {
	if c.writes.Add(1) == 1 && c.w.dropCancels && len(p) >= 8 && bytes.Equal(p[4:8], cancelRequestCode) {
		c.Conn.Close()
		return 0, errors.New("wire: cancel request dropped by the test")
	}
	// The startup message is the first write; count from the first write
	// after the server has answered, as a round trip each.
	if c.read.Swap(false) {
		c.w.trips.Add(1)
	}
	return c.Conn.Write(p)
}

// wireConnect opens a connection whose search_path is the env's schema
// through w, with modify applied to its config.
func (e *env) wireConnect(tb testing.TB, w *wire, modify func(*pgx.ConnConfig)) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgx.ParseConfig(e.URL)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = e.Schema
	cfg.DialFunc = w.dial
	if modify != nil {
		modify(cfg)
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("PostgreSQL at %s (%s): %v", e.URL, testenv.PostgresURLVar, err)
	}
	tb.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// wirePool opens a pool of at most maxConns connections through w.
func (e *env) wirePool(tb testing.TB, w *wire, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(e.URL)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = e.Schema
	cfg.ConnConfig.DialFunc = w.dial
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}
