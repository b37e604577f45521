package redislease

// WithSlotReload gives the tests the Cluster client wrapper that New does
// not apply yet (see withSlotReload).
var WithSlotReload = withSlotReload
