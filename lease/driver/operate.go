package driver

import (
	"context"
	"fmt"
	"time"
)

// Operating leases: the capabilities an operator's tool (fencekit lease
// ls, show, watch and revoke) reaches the store through. A backend that
// implements them lets an operator see every lease of its namespace and
// end a stuck holder's grant from any process; the holder learns of it at
// its next renewal at the latest, and fencing at the store does the rest.

// Status is one lease name as the store sees it: its current grant, if
// any, and its line of waiters.
type Status struct {
	// Name is the lease name.
	Name string
	// Holder is the current grant, as Inspector.Holder reports it; its
	// Owner is empty when no one holds Name.
	Holder Holder
	// Waiters is how many live waiters the store keeps in line for Name
	// (see "Waiters in line"): 0 when there are none, or when the backend
	// keeps no line (Limits.Queues unset). A waiter whose place lapsed is
	// not counted.
	Waiters int
}

// Held reports whether someone holds the name.
func (s Status) Held() bool { return s.Holder.Owner != "" }

// Lister is implemented by backends that can list the leases of their
// namespace (the key prefix, schema, etcd prefix, ZooKeeper root or table
// the backend was configured with).
type Lister interface {
	// List returns the status of every lease name that begins with
	// prefix ("" for all) and is held or has live waiters in line, in
	// byte order of the names. A name that is free and has no waiters is
	// not listed, even if the store keeps a record of it (a token, ended
	// owners). The listing is not one snapshot on every store: a grant
	// made or ended while it runs may be missed or seen twice over, never
	// invented. ctx bounds the whole listing, which may take several
	// requests (a scan of the keyspace or table, then a read per name).
	// Errors: the store's, wrapped; ErrSetup for a store that is not set
	// up.
	List(ctx context.Context, prefix string) ([]Status, error)

	// Status returns the status of one name: a free name without waiters
	// is Status{Name: name}, never an error. ctx bounds the read.
	// Errors: ErrInvalidName before any I/O, the store's, wrapped.
	Status(ctx context.Context, name string) (Status, error)
}

// Revoker is implemented by backends that can end a grant from outside the
// holder's process.
type Revoker interface {
	// Revoke ends the grant of h.Name if the store still names h.Owner
	// with h.Token as its holder (compare-and-delete, as Release, from any
	// process), in one atomic step at the store, and wakes waiters as a
	// release does (with a line, the oldest live waiter is next). The
	// name's token is kept: the next grant of h.Name gets a token greater
	// than h.Token.
	//
	// The owner is then ended as if its grant had been lost, and recorded
	// as ended for at least RevokedOwnerTTL(h): its Renew returns
	// ErrNotHeld (so its Manager ends the lease at its next renewal, or at
	// once where the store pushes the loss), its Acquire is refused (a
	// late or repeated acquire request grants nothing), and its Release
	// returns ErrNotHeld (or nil on a store that records only that an
	// owner ended, not how: pglease).
	//
	// It returns an error matching ErrNotHeld, changing nothing, when the
	// store does not name h.Owner with h.Token as the holder of h.Name
	// (the grant ended or another holds the name: read the holder again).
	// ctx bounds the request; a revoke whose outcome is unknown (ctx
	// ended after it was sent) may have been applied: read the holder
	// again. Errors: ErrInvalidName before any I/O, the store's, wrapped.
	Revoke(ctx context.Context, h Holder) error
}

// RevokedOwnerTTL is how long a store must remember an owner whose grant h
// Revoke ended: EndedOwnerTTL of the time the grant had left
// (h.Remaining), that is at least 10 seconds. A late acquire request of
// that owner was sent before its grant was made, so it has been on its way
// at least as long as the grant lived.
func RevokedOwnerTTL(h Holder) time.Duration { return EndedOwnerTTL(h.Remaining) }

// CheckRevoke returns an error, before any I/O, when h cannot name a grant:
// an invalid name (ErrInvalidName), an empty owner or a zero token.
// Backends call it first in Revoke.
func CheckRevoke(h Holder) error {
	if err := ValidateName(h.Name); err != nil {
		return err
	}
	if h.Owner == "" {
		return fmt.Errorf("lease: revoke %q: the owner is empty: read the holder first", h.Name)
	}
	if h.Token == 0 {
		return fmt.Errorf("lease: revoke %q: the token is 0: read the holder first", h.Name)
	}
	return nil
}
