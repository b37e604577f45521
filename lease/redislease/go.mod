module github.com/fencekit/fencekit/lease/redislease

go 1.26.0

replace (
	github.com/fencekit/fencekit => ../..
	github.com/fencekit/fencekit/internal/redistest => ../../internal/redistest
)

require (
	github.com/fencekit/fencekit v0.0.0-00010101000000-000000000000
	github.com/fencekit/fencekit/internal/redistest v0.0.0-00010101000000-000000000000
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/fencekit/fencekit/internal/testkit v0.0.0-00010101000000-000000000000
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

replace github.com/fencekit/fencekit/internal/testkit => ../../internal/testkit
