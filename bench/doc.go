// Package bench holds the side-by-side benchmarks of fencekit against the
// lock libraries users would pick instead (github.com/bsm/redislock,
// github.com/go-redsync/redsync/v4, cirello.io/pglock) and against the raw
// floor of each store. It is
// its own module so that those libraries never become dependencies of
// fencekit.
//
//   - BenchmarkCycle, BenchmarkCyclePaired: an uncontended acquire+release.
//   - BenchmarkManagerOverhead: the lease Manager's Go-side cost per cycle,
//     without I/O.
//   - BenchmarkHandoff: the latency from a release to the next holder's
//     acquire, with blocked waiters.
//   - cmd/renewscale: the cost of keeping 1 to 10,000 leases alive, with and
//     without batched renewals.
//   - BenchmarkGuardPaired: fenced versus plain PostgreSQL writes, paired
//     operation by operation (sqlguard's and blobguard's own benchmarks
//     cover the rest of the guards).
//   - BenchmarkPGCycle, BenchmarkPGHandoff: leases in PostgreSQL, pglease
//     in table and session mode against the same statements sent directly
//     and against cirello.io/pglock.
//   - BenchmarkPGThroughput, BenchmarkRedisThroughput: acquire + release
//     throughput at 1 to 200 workers, on distinct names and on one.
//   - BenchmarkPGRenewLoad, BenchmarkRedisRenewLoad: the requests that
//     keep 1,000 leases alive.
//
// The benchmarks run against the Redis at FENCE_REDIS_URL (default
// redis://127.0.0.1:6379/0) under unique key prefixes and the PostgreSQL at
// FENCE_POSTGRES_URL in a throwaway schema, from this directory
// (BenchmarkCycle reads fencekit's Lua scripts from ../lease/redislease).
// scripts/bench.sh runs them all, with the guards' own benchmarks, and prints
// benchstat tables; docs/benchmarks.md has the results and what they mean.
// Without -bench, go test runs only a few fast unit tests of the helpers.
package bench
