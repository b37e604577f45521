module github.com/fencekit/fencekit/internal/redistest

go 1.26.0

replace github.com/fencekit/fencekit => ../..

require github.com/redis/go-redis/v9 v9.23.0

require go.yaml.in/yaml/v3 v3.0.6 // indirect

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/fencekit/fencekit/internal/testkit v0.0.0-00010101000000-000000000000
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/fencekit/fencekit/internal/testkit => ../testkit
