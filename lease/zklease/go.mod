module github.com/fencekit/fencekit/lease/zklease

go 1.26.0

require (
	github.com/fencekit/fencekit v0.1.0
	github.com/go-zookeeper/zk v1.0.4
	go.uber.org/goleak v1.3.0
)
