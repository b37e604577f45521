package fencegrpc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencegrpc"
	"github.com/fencekit/fencekit/fencewire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// health is a real service (gRPC's health protocol: a unary Check and a
// server-streaming Watch) that records the token its handlers see. A
// service name "stale" makes the handler's own write stale.
type recorder struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
	seen  atomic.Pointer[fencewire.Value]
	token atomic.Uint64
}

func (h *recorder) record(ctx context.Context) {
	h.calls.Add(1)
	v, _ := fencewire.FromContext(ctx)
	h.seen.Store(&v)
	tok, _ := fence.FromContext(ctx)
	h.token.Store(uint64(tok))
}

func (h *recorder) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.record(ctx)
	if req.GetService() == "stale" {
		v, _ := fencewire.FromContext(ctx)
		return nil, fmt.Errorf("write row: %w", fence.Stale("row 1", v.Token, v.Token+1))
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *recorder) Watch(req *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	h.record(ss.Context())
	if req.GetService() == "stale" {
		v, _ := fencewire.FromContext(ss.Context())
		return fence.Stale("row 1", v.Token, v.Token+1)
	}
	return ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// serve starts a real gRPC server on loopback with the server
// interceptors, and a client connection with the client interceptors.
func serve(t *testing.T, s *fencegrpc.Server, c *fencegrpc.Client) (healthpb.HealthClient, *recorder) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.Unary()), grpc.ChainStreamInterceptor(s.Stream()))
	h := &recorder{}
	healthpb.RegisterHealthServer(srv, h)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(c.Unary()), grpc.WithChainStreamInterceptor(c.Stream()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn), h
}

// both calls the unary and the streaming method and returns their errors.
func both(ctx context.Context, hc healthpb.HealthClient, service string) (unary, stream error) {
	_, unary = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	ws, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return unary, err
	}
	_, stream = ws.Recv()
	return unary, stream
}

func TestTokenReachesTheHandler(t *testing.T) {
	hc, h := serve(t, &fencegrpc.Server{}, &fencegrpc.Client{})
	want := fencewire.Value{Resource: "jobs/café", Token: 1<<64 - 1}
	ctx := fencewire.NewContext(t.Context(), want)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := *h.seen.Load(); got != want || fence.Token(h.token.Load()) != want.Token {
		t.Errorf("unary handler saw %+v, token %d; want %+v", got, h.token.Load(), want)
	}
	h.seen.Store(nil)
	ws, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Recv(); err != nil {
		t.Fatal(err)
	}
	if got := *h.seen.Load(); got != want {
		t.Errorf("streaming handler saw %+v; want %+v", got, want)
	}
	// No token, not required: the handler sees none.
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if h.token.Load() != 0 {
		t.Errorf("handler saw token %d for a call without one", h.token.Load())
	}
}

func reasonOf(err error) (codes.Code, string) {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code(), info.GetReason()
		}
	}
	return st.Code(), ""
}

func TestBadEntriesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		server  fencegrpc.Server
		entries []string
		reason  string
		is      error
	}{
		{"malformed", fencegrpc.Server{}, []string{`42;resource="r"`}, fencegrpc.ReasonMalformed, fencewire.ErrMalformed},
		{"repeated", fencegrpc.Server{}, []string{`"1";resource="r"`, `"1";resource="r"`}, fencegrpc.ReasonMalformed, fencewire.ErrMalformed},
		{"missing, required", fencegrpc.Server{Require: true}, nil, fencegrpc.ReasonMissing, fencewire.ErrRejected},
		{"missing, checked", fencegrpc.Server{Checker: fencecheck.NewMemory()}, nil, fencegrpc.ReasonMissing, fencewire.ErrRejected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc, h := serve(t, &tc.server, &fencegrpc.Client{})
			ctx := t.Context()
			for _, e := range tc.entries {
				ctx = metadata.AppendToOutgoingContext(ctx, fencewire.MetadataKey, e)
			}
			unary, stream := both(ctx, hc, "")
			for kind, err := range map[string]error{"unary": unary, "stream": stream} {
				code, reason := reasonOf(err)
				if code != codes.InvalidArgument || reason != tc.reason || !errors.Is(err, tc.is) {
					t.Errorf("%s: %v (code %s, reason %q); want InvalidArgument, %s", kind, err, code, reason, tc.reason)
				}
			}
			if n := h.calls.Load(); n != 0 {
				t.Errorf("the handlers ran %d times for refused calls", n)
			}
		})
	}
}

func TestStaleCallIsRejectedBeforeTheHandler(t *testing.T) {
	chk := fencecheck.NewMemory()
	hc, h := serve(t, &fencegrpc.Server{Checker: chk}, &fencegrpc.Client{})
	resource := fmt.Sprintf("jobs/%x", rand.Uint64())
	with := func(tok fence.Token) context.Context {
		return fencewire.NewContext(t.Context(), fencewire.Value{Resource: resource, Token: tok})
	}
	if u, s := both(with(9), hc, ""); u != nil || s != nil {
		t.Fatalf("token 9: %v, %v", u, s)
	}
	before := h.calls.Load()
	unary, stream := both(with(5), hc, "")
	for kind, err := range map[string]error{"unary": unary, "stream": stream} {
		se, ok := fence.AsStale(err)
		if !ok || se.Resource != resource || se.Presented != 5 || se.Current != 9 {
			t.Errorf("%s: %v; want a *fence.StaleError naming 5 and 9", kind, err)
		}
		if code, reason := reasonOf(err); code != codes.FailedPrecondition || reason != fencegrpc.ReasonStale {
			t.Errorf("%s: code %s, reason %q; want FailedPrecondition, %s", kind, code, reason, fencegrpc.ReasonStale)
		}
	}
	if n := h.calls.Load() - before; n != 0 {
		t.Errorf("the handlers ran %d times for stale calls", n)
	}
}

func TestHandlersStaleWriteIsSentAsStale(t *testing.T) {
	hc, _ := serve(t, &fencegrpc.Server{Require: true}, &fencegrpc.Client{})
	unary, stream := both(fencewire.NewContext(t.Context(), fencewire.Value{Resource: "jobs/w", Token: 41}), hc, "stale")
	for kind, err := range map[string]error{"unary": unary, "stream": stream} {
		if se, ok := fence.AsStale(err); !ok || se.Resource != "row 1" || se.Presented != 41 || se.Current != 42 {
			t.Errorf("%s: %v; want the handler's StaleError", kind, err)
		}
	}
}

// failingChecker fails every check, as a checker whose store is down does.
type failingChecker struct{}

func (failingChecker) Check(context.Context, string, fence.Token) error {
	return errors.New("connection refused")
}

func TestCheckerFailureIsUnavailable(t *testing.T) {
	hc, h := serve(t, &fencegrpc.Server{Checker: failingChecker{}, Logger: discard()}, &fencegrpc.Client{})
	unary, stream := both(fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r", Token: 1}), hc, "")
	for kind, err := range map[string]error{"unary": unary, "stream": stream} {
		if code, _ := reasonOf(err); code != codes.Unavailable || !errors.Is(err, fencewire.ErrUnavailable) {
			t.Errorf("%s: %v; want Unavailable and fencewire.ErrUnavailable", kind, err)
		}
	}
	if h.calls.Load() != 0 {
		t.Error("a handler ran although the token was not checked")
	}
}

func TestClientRefusesBeforeIO(t *testing.T) {
	hc, h := serve(t, &fencegrpc.Server{}, &fencegrpc.Client{Require: true})
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want error
	}{
		{"token 0", fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r"}), fence.ErrInvalidToken},
		{"bad resource", fencewire.NewContext(t.Context(), fencewire.Value{Resource: "", Token: 1}), fencewire.ErrInvalid},
		{"no token", t.Context(), fencegrpc.ErrNoToken},
		{"two tokens", metadata.AppendToOutgoingContext(fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r", Token: 1}),
			fencewire.MetadataKey, `"1";resource="r"`), fencegrpc.ErrTwoTokens},
	} {
		unary, stream := both(tc.ctx, hc, "")
		if !errors.Is(unary, tc.want) || !errors.Is(stream, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, unary, stream, tc.want)
		}
	}
	if n := h.calls.Load(); n != 0 {
		t.Errorf("%d refused calls reached a handler", n)
	}
}

// A call with a token that ends without an answer (its deadline passes
// while the handler runs) is an unknown outcome: the handler may have
// written. Without a token, the status is returned as it is.
func TestNoAnswerIsUnknown(t *testing.T) {
	release := make(chan struct{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fencegrpc.Server{}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.Unary()))
	healthpb.RegisterHealthServer(srv, slowHealth{release})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	t.Cleanup(func() { close(release) })
	c := &fencegrpc.Client{}
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(c.Unary()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	for _, fenced := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		if fenced {
			ctx = fencewire.NewContext(ctx, fencewire.Value{Resource: "r", Token: 1})
		}
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("fenced=%v: %v; want DeadlineExceeded", fenced, err)
		}
		if errors.Is(err, fence.ErrOutcomeUnknown) != fenced {
			t.Errorf("fenced=%v: %v: matches fence.ErrOutcomeUnknown: %v", fenced, err, !fenced)
		}
	}
}

// slowHealth answers only when released.
type slowHealth struct {
	release chan struct{}
}

func (h slowHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return nil, ctx.Err()
}

func (slowHealth) List(context.Context, *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	return nil, status.Error(codes.Unimplemented, "")
}

func (slowHealth) Watch(*healthpb.HealthCheckRequest, grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	return status.Error(codes.Unimplemented, "")
}

// bigintChecker is a Memory checker that stores tokens up to 2^63-1 only,
// as sqlguard.Checker does (its store is a bigint).
type bigintChecker struct{ *fencecheck.Memory }

func (c bigintChecker) Check(ctx context.Context, resource string, tok fence.Token) error {
	if tok > 1<<63-1 {
		return fmt.Errorf("%w: token %d is above 2^63-1", fencecheck.ErrTokenRange, tok)
	}
	return c.Memory.Check(ctx, resource, tok)
}

// A valid token the checker cannot store is OutOfRange with its own
// reason, not a malformed entry, and the client's error says so.
func TestTokenBeyondTheCheckerIsOutOfRange(t *testing.T) {
	hc, h := serve(t, &fencegrpc.Server{Checker: bigintChecker{fencecheck.NewMemory()}}, &fencegrpc.Client{})
	unary, stream := both(fencewire.NewContext(t.Context(), fencewire.Value{Resource: "r", Token: 1 << 63}), hc, "")
	for kind, err := range map[string]error{"unary": unary, "stream": stream} {
		code, reason := reasonOf(err)
		if code != codes.OutOfRange || reason != fencegrpc.ReasonTokenRange || !errors.Is(err, fencecheck.ErrTokenRange) ||
			!errors.Is(err, fencewire.ErrRejected) || errors.Is(err, fencewire.ErrMalformed) {
			t.Errorf("%s: %v (code %s, reason %q); want OutOfRange, %s and fencecheck.ErrTokenRange", kind, err, code, reason, fencegrpc.ReasonTokenRange)
		}
	}
	if h.calls.Load() != 0 {
		t.Error("a handler ran although its token was refused")
	}
}
