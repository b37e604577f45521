package redischeck_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/fencehttp"
	"github.com/fencekit/fencekit/redischeck"
)

// Every replica of a service checks its callers' tokens against one Redis.
// (Compile-only: it needs a Redis server.)
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	checker, err := redischeck.New(rdb)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Before any handler runs: stale calls get 409 and a problem document.
	mux := http.NewServeMux()
	_ = http.ListenAndServe("127.0.0.1:8080", &fencehttp.Handler{Checker: checker, Next: mux})

	// Or directly:
	_ = checker.Check(context.Background(), "jobs/report", 1764636000000001)
}
