package consensus

import "github.com/fencekit/fencekit/lease/zklease/zkleasetest"

// The ZooKeeper tests' helpers, as lease/zklease's tests have them.

// newZKBackend connects a Backend to servers, closed when the test ends,
// once its first session is set up.
var newZKBackend = zkleasetest.NewBackend
