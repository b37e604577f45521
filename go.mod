module github.com/fencekit/fencekit

go 1.26
