module github.com/fencekit/fencekit/dbguard

go 1.26.0

require github.com/fencekit/fencekit v0.1.0
