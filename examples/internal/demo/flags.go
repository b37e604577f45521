package demo

import (
	"flag"
	"fmt"
	"io"
	"time"
)

// Bounds of --ttl: a lease shorter than MinTTL is renewed faster than a
// loaded machine keeps up with, and a demo with leases longer than MaxTTL
// runs for hours.
const (
	MinTTL = 100 * time.Millisecond
	MaxTTL = time.Minute
)

// Flags are the flags the demos share. Register defines them.
type Flags struct {
	TTL         time.Duration // --ttl
	LeaseStore  string        // --lease-store: LeaseRedis, LeasePostgres, ...
	Keep        bool          // --keep
	RedisURL    string        // --redis-url
	PostgresURL string        // --postgres-url
	JSON        string        // --json: the file the run's summary goes to
}

// Register defines the shared flags on fs: --ttl (2s by default),
// --lease-store, --keep, --redis-url, --postgres-url and --json; ttlUsage
// and keepUsage are the program's own words for --ttl and --keep.
func (f *Flags) Register(fs *flag.FlagSet, ttlUsage, keepUsage string) {
	fs.DurationVar(&f.TTL, "ttl", 2*time.Second, ttlUsage)
	fs.BoolVar(&f.Keep, "keep", false, keepUsage)
	fs.StringVar(&f.LeaseStore, "lease-store", LeaseRedis, LeaseStoreUsage)
	fs.StringVar(&f.RedisURL, "redis-url", "", "Redis URL (default: $FENCE_REDIS_URL, else redis://127.0.0.1:6379/0, else one it starts)")
	fs.StringVar(&f.PostgresURL, "postgres-url", "", "PostgreSQL URL (default: $FENCE_POSTGRES_URL, else postgres://postgres@127.0.0.1:5432/test, else one it starts)")
	fs.StringVar(&f.JSON, "json", "", "also write a machine-readable summary of the run to this file")
}

// CheckTTL returns an error when --ttl is not a whole number of
// milliseconds from MinTTL to MaxTTL, else nil.
func (f *Flags) CheckTTL() error {
	if f.TTL < MinTTL || f.TTL > MaxTTL || f.TTL%time.Millisecond != 0 {
		return fmt.Errorf("--ttl %v: must be a whole number of milliseconds, from %v to %v", f.TTL, MinTTL, MaxTTL)
	}
	return nil
}

// CheckLeaseStore returns an error when --lease-store names no store, or a
// store that cannot keep a lease of --ttl (CheckTTL), else nil.
func (f *Flags) CheckLeaseStore() error {
	if err := CheckLeaseStore(f.LeaseStore); err != nil {
		return err
	}
	return CheckTTL(f.LeaseStore, f.TTL)
}

// ParseFlags parses args with fs, whose usage is the text usage followed
// by the flags' defaults. A request for help (WantsHelp) prints the usage
// on stdout and returns flag.ErrHelp; a bad flag's message and the usage
// go to stderr; an argument that is not a flag is an error.
func ParseFlags(fs *flag.FlagSet, usage string, args []string, stdout, stderr io.Writer) error {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if WantsHelp(args) {
		fs.SetOutput(stdout)
		fs.Usage()
		return flag.ErrHelp
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return nil
}
