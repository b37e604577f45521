package fencegrpc_test

import (
	"context"
	"errors"
	"io"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencegrpc"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/guardtest"
)

// The Client reports one event per fenced call (a unary call when it
// returns, a stream when it ends), the Server one per call it admits or
// refuses, each with the outcome the caller (or the refusal) got, over a
// real gRPC server on loopback.
func TestObserversSeeEveryFencedRPC(t *testing.T) {
	var server, client guardtest.Recorder
	hc, _ := serve(t, &fencegrpc.Server{Checker: fencecheck.NewMemory(), Observer: &server}, &fencegrpc.Client{Observer: &client})
	const svc = "grpc.health.v1.Health"
	want := func(op string, token fence.Token, o fence.Outcome) guardtest.Want {
		return guardtest.Want{Guard: "fencegrpc", Class: svc, Op: op, Resource: "inventory/7", Token: token, Outcome: o}
	}
	at := func(token fence.Token) context.Context {
		return fencewire.NewContext(t.Context(), fencewire.Value{Resource: "inventory/7", Token: token})
	}
	watch := func(ctx context.Context) error {
		ws, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		for {
			if _, err := ws.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
	}

	_, err := hc.Check(at(5), &healthpb.HealthCheckRequest{})
	client.One(t, want("call", 5, fence.Accepted), err)
	server.One(t, want("admit", 5, fence.Accepted), nil)
	err = watch(at(6))
	client.One(t, want("call", 6, fence.Accepted), err)
	server.One(t, want("admit", 6, fence.Accepted), nil)

	_, err = hc.Check(at(4), &healthpb.HealthCheckRequest{})
	client.One(t, want("call", 4, fence.Rejected), err)
	if e := server.Take(); len(e) != 1 || e[0].Outcome != fence.Rejected || e[0].Token != 4 {
		t.Fatalf("the server's events for a stale call: %+v", e)
	}
	err = watch(at(4))
	client.One(t, want("call", 4, fence.Rejected), err)
	if e := server.Take(); len(e) != 1 || e[0].Outcome != fence.Rejected {
		t.Fatalf("the server's events for a stale stream: %+v", e)
	}

	// Not fenced: no client event; the server, whose Checker requires a
	// token, refuses it.
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); !errors.Is(err, fencewire.ErrRejected) {
		t.Fatalf("a call without a token: %v", err)
	}
	if a, b := client.Take(), server.Take(); len(a) != 0 || len(b) != 1 || b[0].Outcome != fence.Failed {
		t.Fatalf("a call without a token: client events %+v, server events %+v", a, b)
	}

	// A call whose context ends before its answer is an unknown outcome.
	ctx, cancel := context.WithCancel(at(9))
	cancel()
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{})
	client.One(t, want("call", 9, fence.Unknown), err)
}
