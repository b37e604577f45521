package lease

import "time"

// RenewDelayForTest exposes renewDelay and the grid origin to the tests.
func (m *Manager) RenewDelayForTest(due time.Time) time.Duration { return m.renewDelay(due) }

// EpochForTest returns the origin of the Manager's heartbeat grid.
func (m *Manager) EpochForTest() time.Time { return m.epoch }
