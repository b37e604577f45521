package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencekit/fencekit/lease"
	"github.com/fencekit/fencekit/lease/driver"
	"github.com/fencekit/fencekit/lease/memlease"
)

// FuzzValidateName: a lease name is refused with ErrInvalidName (no
// panic), or it is 1 to MaxNameLen bytes of UTF-8 without control
// characters, and a Manager can acquire and release a lease by it.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"jobs/billing", "a", "{x}", "%7B", "ü ñ", "a:b:c", "", "a\x00b", "tab\there", "\u0085",
		"\xff\xfe", strings.Repeat("n", driver.MaxNameLen), strings.Repeat("n", driver.MaxNameLen+1), "emoji 🔒", "\u200b"} {
		f.Add(s)
	}
	m, err := lease.NewManager(memlease.New(), time.Second)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := lease.ValidateName(name)
		held, tryErr := m.TryAcquire(context.Background(), name)
		if held != nil {
			defer held.Release(context.Background()) //nolint:errcheck
		}
		if err != nil {
			if !errors.Is(err, lease.ErrInvalidName) || !errors.Is(tryErr, lease.ErrInvalidName) {
				t.Fatalf("ValidateName: %v, TryAcquire: %v; want both to match ErrInvalidName", err, tryErr)
			}
			return
		}
		if name == "" || len(name) > driver.MaxNameLen || !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0 {
			t.Fatalf("name %q accepted", name)
		}
		if tryErr != nil && !errors.Is(tryErr, lease.ErrNotAcquired) {
			t.Fatalf("TryAcquire(%q): %v", name, tryErr)
		}
		l, err := m.TryAcquire(context.Background(), name+"/x")
		if err != nil && !errors.Is(err, lease.ErrInvalidName) { // name+"/x" may be too long
			t.Fatalf("TryAcquire(%q): %v", name+"/x", err)
		}
		if l != nil {
			if l.Name() != name+"/x" || l.Token() == 0 {
				t.Fatalf("lease %q token %d", l.Name(), l.Token())
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
	})
}

// FuzzNewManagerOptions: NewManager never panics; it refuses options with
// ErrInvalidOptions, or the options it keeps (defaults filled in) hold
// every relation its documentation promises, and keep every value the
// caller set.
func FuzzNewManagerOptions(f *testing.F) {
	us := func(d time.Duration) int64 { return int64(d / time.Microsecond) }
	f.Add(us(time.Second), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), "", false)
	f.Add(us(10*time.Millisecond), us(3*time.Millisecond), int64(-1), int64(-1), us(time.Millisecond), us(time.Millisecond), us(10*time.Millisecond), "svc/pid-1", true)
	f.Add(us(time.Second), us(600*time.Millisecond), int64(0), int64(0), int64(0), int64(0), int64(0), "has space", false)
	f.Add(us(1500*time.Microsecond), int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), strings.Repeat("x", 129), false)
	f.Add(int64(-5), int64(-5), int64(-5), int64(-5), int64(-5), int64(-5), int64(-5), "\x00", false)
	f.Add(us(time.Hour), int64(1), us(time.Hour), int64(0), int64(0), int64(0), int64(0), "ok", false)
	f.Fuzz(func(t *testing.T, ttlUs, renewUs, marginUs, batchUs, retryUs, pollUs, releaseUs int64, identity string, noAuto bool) {
		d := func(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
		ttl := d(ttlUs)
		set := lease.Options{
			RenewInterval: d(renewUs), SafetyMargin: d(marginUs), RenewBatchWindow: d(batchUs),
			RenewRetryInterval: d(retryUs), PollInterval: d(pollUs), ReleaseTimeout: d(releaseUs), Identity: identity,
			DisableAutoRenew: noAuto,
		}
		if marginUs == -1 {
			set.SafetyMargin = lease.NoSafetyMargin
		}
		if batchUs == -1 {
			set.RenewBatchWindow = lease.NoBatching
		}
		m, err := lease.NewManager(memlease.New(), ttl, func(o *lease.Options) {
			ttl := o.TTL
			*o = set
			o.TTL = ttl
		})
		if err != nil {
			if !errors.Is(err, lease.ErrInvalidOptions) {
				t.Fatalf("error %v does not match ErrInvalidOptions", err)
			}
			return
		}
		o := m.Options()
		var bad []string
		check := func(ok bool, what string) {
			if !ok {
				bad = append(bad, what)
			}
		}
		check(o.TTL == ttl && ttl >= time.Millisecond && ttl%time.Millisecond == 0, "TTL as given, a whole number of ms")
		check(o.SafetyMargin >= 0 && o.SafetyMargin < o.TTL, "0 <= SafetyMargin < TTL")
		check(o.RenewInterval >= time.Millisecond && o.RenewInterval <= (o.TTL-o.SafetyMargin)/2, "1ms <= RenewInterval <= (TTL-margin)/2")
		check(o.RenewBatchWindow >= 0 && o.RenewBatchWindow < o.RenewInterval/4 || o.RenewBatchWindow == 0, "0 <= RenewBatchWindow < RenewInterval/4")
		check(o.RenewRetryInterval >= time.Millisecond, "RenewRetryInterval >= 1ms")
		check(o.PollInterval >= time.Millisecond, "PollInterval >= 1ms")
		check(o.ReleaseTimeout >= 10*time.Millisecond, "ReleaseTimeout >= 10ms")
		check(len(o.Identity) <= 128 && strings.IndexFunc(o.Identity, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) < 0, "Identity printable, no spaces, <= 128 bytes")
		check(o.DisableAutoRenew == noAuto, "DisableAutoRenew as given")
		for _, kept := range []struct {
			set, got time.Duration
			name     string
		}{{set.RenewInterval, o.RenewInterval, "RenewInterval"}, {set.SafetyMargin, o.SafetyMargin, "SafetyMargin"},
			{set.RenewBatchWindow, o.RenewBatchWindow, "RenewBatchWindow"}, {set.RenewRetryInterval, o.RenewRetryInterval, "RenewRetryInterval"},
			{set.PollInterval, o.PollInterval, "PollInterval"}, {set.ReleaseTimeout, o.ReleaseTimeout, "ReleaseTimeout"}} {
			check(kept.set <= 0 || kept.got == kept.set, kept.name+" kept as given")
		}
		check(identity == "" || o.Identity == identity, "Identity kept as given")
		if len(bad) > 0 {
			t.Fatalf("NewManager(ttl %v, %+v) accepted, but its options break: %s\n%+v", ttl, set, strings.Join(bad, "; "), o)
		}
	})
}
