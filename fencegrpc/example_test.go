package fencegrpc_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencegrpc"
	"github.com/fencekit/fencekit/fencewire"
)

// A gRPC service checks the callers' tokens before its handlers run; a
// stale call fails with a *fence.StaleError that also carries the gRPC
// status.
func Example() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	check := &fencegrpc.Server{Checker: fencecheck.NewMemory()}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(check.Unary()), grpc.ChainStreamInterceptor(check.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	send := &fencegrpc.Client{Require: true}
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(send.Unary()), grpc.WithChainStreamInterceptor(send.Stream()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)

	for _, tok := range []fence.Token{33, 34, 33} {
		ctx := fencewire.NewContext(context.Background(), fencewire.Value{Resource: "jobs/report", Token: tok})
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if se, ok := fence.AsStale(err); ok {
			fmt.Printf("rejected (%s): presented %d, current %d\n", status.Code(err), se.Presented, se.Current)
			continue
		}
		fmt.Println(err)
	}
	// Output:
	// <nil>
	// <nil>
	// rejected (FailedPrecondition): presented 33, current 34
}
