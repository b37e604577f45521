module github.com/fencekit/fencekit/lease/zklease

go 1.26.0

require (
	github.com/fencekit/fencekit v0.0.0-00010101000000-000000000000
	github.com/fencekit/fencekit/internal/testkit v0.0.0-00010101000000-000000000000
	github.com/fencekit/fencekit/internal/zktest v0.0.0-00010101000000-000000000000
	github.com/go-zookeeper/zk v1.0.4
	go.uber.org/goleak v1.3.0
)

replace (
	github.com/fencekit/fencekit => ../..
	github.com/fencekit/fencekit/internal/zktest => ../../internal/zktest
)

replace github.com/fencekit/fencekit/internal/testkit => ../../internal/testkit
