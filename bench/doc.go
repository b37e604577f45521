// Package bench holds the side-by-side benchmarks of fencekit against the
// lock libraries users would pick instead. It is its own module so that
// those libraries never become dependencies of fencekit.
package bench
