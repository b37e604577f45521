// Command etcdserver is the etcd server (go.etcd.io/etcd/server/v3, the
// version internal/rig/go.mod requires), for the example programs' --lease-store
// etcd when no etcd answers. A current etcd cannot be built with go install
// (its main module has replace directives), so package services builds this
// main once into the user cache, as it does versitygw, and starts it on
// loopback ports with a throwaway data directory. It takes etcd's own flags.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
