package fencegrpc_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencegrpc"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/internal/testkit/pairbench"
)

// BenchmarkUnary: one unary call over a real loopback server, plain, with
// the token sent and read by the interceptors, and also checked in memory,
// interleaved call by call (internal/testkit/pairbench).
//
//	go test -run '^$' -bench . -count 6 ./fencegrpc/ > bench.txt
//	go run golang.org/x/perf/cmd/benchstat@latest bench.txt
func BenchmarkUnary(b *testing.B) {
	tok := fence.Token(1764636000000001)
	op := func(kind string) pairbench.Op {
		var sopts []grpc.ServerOption
		copts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if kind != "plain" {
			s := &fencegrpc.Server{Require: true}
			if kind == "checked" {
				s.Checker = fencecheck.NewMemory()
			}
			c := &fencegrpc.Client{}
			sopts = append(sopts, grpc.ChainUnaryInterceptor(s.Unary()))
			copts = append(copts, grpc.WithChainUnaryInterceptor(c.Unary()))
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := grpc.NewServer(sopts...)
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go func() { _ = srv.Serve(lis) }()
		b.Cleanup(srv.Stop)
		conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), copts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		hc := healthpb.NewHealthClient(conn)
		return pairbench.Op{Name: kind, Call: func() error {
			tok++
			ctx := fencewire.NewContext(context.Background(), fencewire.Value{Resource: "jobs/nightly", Token: tok})
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		}}
	}
	pairbench.Run(b, op("plain"), op("token"), op("checked"))
}
