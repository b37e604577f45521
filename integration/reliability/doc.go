// Package reliability holds fencekit's reliability suite: evidence, with
// figures, that no stale write is accepted and no write is lost, under
// concurrency, faults, paused processes and clock jumps. It has no code of
// its own, only tests (see docs/reliability.md):
//
//   - history checks: concurrent runs of sqlguard and blobguard against the
//     real stores, every operation recorded and the history checked for
//     linearizability (github.com/anishathalye/porcupine) against a model
//     of a register guarded by a monotone token, with faults injected
//     during the runs;
//   - paused holders: real processes holding a Redis lease, frozen with
//     SIGSTOP for random durations around the TTL while other processes
//     take over, writing to PostgreSQL and S3; the stores' own records are
//     checked afterwards;
//   - clock faults: a Redis server whose wall clock jumps forward;
//   - the lease history check: on every lease backend (Redis, PostgreSQL
//     table and session modes, etcd, ZooKeeper), holders behind fault
//     proxies contend for a few names; each grant's validity window, from
//     Acquire's return to the last moment its holder read it valid
//     (Release included), is recorded on one monotonic clock, and no two
//     windows of a name may overlap, tokens growing in window order.
//
// It lives in the integration module so that its test dependencies
// (porcupine, toxiproxy) never reach users of the library.
package reliability
