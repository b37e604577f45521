package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/fencecheck"
	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/fencewire"
	"github.com/fencekit/fencekit/lease/leaseprom"
)

// inventory is the internal inventory service the job calls: POST
// /orders/{id}/release releases an order's reserved stock. It runs in the
// orchestrator's process on a loopback port, behind fencehttp.Handler,
// which refuses a call whose token is older than the newest it accepted
// for the call's resource (409, a stale problem the client's Transport
// turns back into a *fence.StaleError). The handler releases the stock
// under the same checker's Do, so that its effects are ordered by token as
// the checks are (fencecheck: "What a check orders"). A second accepted
// release of one order changes nothing, so that a holder that repeats an
// order its predecessor released (one that was stopped between the call
// and its MariaDB transaction) does not release its stock twice.
type inventory struct {
	url     string
	srv     *http.Server
	checker *fencecheck.Memory
	// reg holds the service's own metrics (fencehttp.Handler.Observer).
	reg *prometheus.Registry

	mu       sync.Mutex
	released map[int]release
	repeats  int // accepted releases of orders already released
}

// release is the release of one order's stock.
type release struct {
	Replica string      `json:"replica"`
	Token   fence.Token `json:"token"`
	At      time.Time   `json:"at"`
}

// startInventory starts the service.
func startInventory() (*inventory, error) {
	inv := &inventory{checker: fencecheck.NewMemory(), reg: prometheus.NewRegistry(), released: map[int]release{}}
	obs, err := leaseprom.New(inv.reg)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/release", inv.release)
	inv.url = "http://" + lis.Addr().String()
	inv.srv = &http.Server{
		Handler:           &fencehttp.Handler{Checker: inv.checker, Observer: obs, Next: mux},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = inv.srv.Serve(lis) }()
	return inv, nil
}

func (inv *inventory) release(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	var body struct {
		Replica string `json:"replica"`
	}
	if err == nil {
		err = json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	v, _ := fencewire.FromContext(r.Context()) // the Handler has a Checker: every call carries a token
	err = inv.checker.Do(r.Context(), v.Resource, v.Token, func() error {
		inv.mu.Lock()
		defer inv.mu.Unlock()
		if _, done := inv.released[id]; done {
			inv.repeats++
			return nil
		}
		inv.released[id] = release{Replica: body.Replica, Token: v.Token, At: time.Now()}
		return nil
	})
	if err != nil && !fencehttp.WriteError(w, err) {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// state returns the orders released, in order, and the repeats.
func (inv *inventory) state() (ids []int, released map[int]release, repeats int) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	released = make(map[int]release, len(inv.released))
	for id, rel := range inv.released {
		released[id] = rel
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids, released, inv.repeats
}

func (inv *inventory) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = inv.srv.Shutdown(ctx)
}
