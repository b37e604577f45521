// Package integration holds the end-to-end tests over real services and real
// processes. It is its own module so that its heavy test dependencies never
// become dependencies of fencekit.
package integration
