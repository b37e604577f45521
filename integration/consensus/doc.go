// Package consensus holds the end-to-end tests of the consensus-store
// backends (etcdlease, zklease): a holder cut off from its cluster, or
// frozen between checking its lease and writing, is rejected as stale at
// PostgreSQL (sqlguard) and S3 (blobguard) once another client took the
// lease. The backends' own tests (lease/etcdlease, lease/zklease) need only
// their own store; the writes through the guards are here.
//
// etcd runs a process per member (lease/etcdlease/etcdtest); ZooKeeper is
// Debian's, started per test (internal/testkit/zktest; scripts/services.sh
// ensure_zookeeper installs it). PostgreSQL and S3 come from FENCE_* (see
// internal/testkit/testenv), else internal/rig/services finds or starts them.
package consensus
