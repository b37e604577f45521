package lease

import (
	"fmt"
	"strings"

	"github.com/fencekit/fencekit/lease/driver"
)

// The backend contract lives in package driver (as database/sql/driver
// beside database/sql): everything a backend implements or calls. The
// names below are the ones a user of the Manager meets (its arguments,
// its answers, the errors it returns); they are the driver's own.

// Backend is a store that can hold leases: see driver.Backend. Construct
// one with a backend package (redislease, pglease, etcdlease, zklease,
// memlease) and pass it to NewManager.
type Backend = driver.Backend

// Holder is the current grant of a lease, as the store sees it: see
// driver.Holder. Manager.Holder, Election.Leader and Election.Observe
// return it.
type Holder = driver.Holder

// NotAcquiredError is the rich form of ErrNotAcquired: see
// driver.NotAcquiredError.
type NotAcquiredError = driver.NotAcquiredError

// SetupError is the rich form of ErrSetup: see driver.SetupError.
type SetupError = driver.SetupError

// Errors of the contract that the Manager passes on to its users.
var (
	// ErrNotAcquired: see driver.ErrNotAcquired. TryAcquire returns it
	// when another holder has the lease, Acquire (joined with the
	// context's error) when its context ends first.
	ErrNotAcquired = driver.ErrNotAcquired
	// ErrNotHeld: see driver.ErrNotHeld. Manager.Holder returns it when no
	// one holds the lease.
	ErrNotHeld = driver.ErrNotHeld
	// ErrSetup: see driver.ErrSetup. Manager.Check, Acquire, Run and
	// Election.Run return it, at once, for a store that is not set up.
	ErrSetup = driver.ErrSetup
	// ErrInvalidName: see driver.ErrInvalidName. Returned before any I/O.
	ErrInvalidName = driver.ErrInvalidName
)

// ValidateName returns an error matching ErrInvalidName when name cannot be
// a lease name: see driver.ValidateName, and names ending in "#permit/"
// and digits are reserved for the slots of semaphores (SlotName). The
// Manager calls it before any I/O.
func ValidateName(name string) error {
	if err := driver.ValidateName(name); err != nil {
		return err
	}
	if reservedName(name) {
		return fmt.Errorf("%w: name %q ends in %q and digits, the form reserved for the slots of semaphores (lease.SlotName)", ErrInvalidName, name, permitMarker)
	}
	return nil
}

// permitMarker joins a semaphore's name and a slot number in the slot's
// lease name. Lease names that end in it followed by digits are reserved
// (ValidateName refuses them), so a slot name is never a user's lease
// name, and two semaphores never share a slot.
const permitMarker = "#permit/"

// reservedName reports whether name ends in "#permit/" and one or more
// digits: the form of a semaphore slot.
func reservedName(name string) bool {
	digits := strings.TrimRightFunc(name, func(r rune) bool { return r >= '0' && r <= '9' })
	return len(digits) < len(name) && strings.HasSuffix(digits, permitMarker)
}
