module github.com/fencekit/fencekit/bench

go 1.26.0

replace github.com/fencekit/fencekit => ../
