module github.com/fencekit/fencekit/internal/testkit

go 1.26.0

replace github.com/fencekit/fencekit => ../..

require github.com/fencekit/fencekit v0.0.0-00010101000000-000000000000
