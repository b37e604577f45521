module github.com/fencekit/fencekit/integration

go 1.26.0

replace github.com/fencekit/fencekit => ../
