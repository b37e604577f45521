module github.com/fencekit/fencekit/examples

go 1.26.0

replace github.com/fencekit/fencekit => ../
