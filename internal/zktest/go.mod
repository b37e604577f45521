module github.com/fencekit/fencekit/internal/zktest

go 1.26.0
