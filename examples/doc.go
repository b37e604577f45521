// Package examples holds runnable programs that show fencekit end to end.
// It is its own module so that what the demos use to start services never
// becomes a dependency of fencekit.
package examples
