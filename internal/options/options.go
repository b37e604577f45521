// Package options applies the functional options of the guards'
// constructors (sqlguard, dbguard, blobguard, dynamoguard), so that each
// reads them the same way. It imports only the standard library.
package options

// Apply returns the zero value of O with each of opts applied to it, in
// order; a nil option is skipped.
func Apply[O any, F ~func(*O)](opts []F) O {
	var o O
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}
