// Package services finds, or starts, the Redis, PostgreSQL and S3-compatible
// servers the example programs need, and says which it used. For each one,
// in order: the address in the environment (FENCE_REDIS_URL,
// FENCE_POSTGRES_URL, FENCE_S3_*); the default local address; a server it
// starts itself on a free loopback port (redis-server, a throwaway
// PostgreSQL cluster, versitygw built once into the user cache); a container
// through testcontainers-go where Docker answers. When none works it returns
// an error naming what is missing and how to provide it.
//
// For programs whose leases live in etcd or ZooKeeper it does the same for
// those (FENCE_ETCD_ENDPOINTS, FENCE_ZK_SERVERS; then 127.0.0.1:2379 and
// 127.0.0.1:2181; then a one-member etcd built once into the user cache, or
// a standalone ZooKeeper from Debian's package).
package services

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/testkit/ports"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// Set is the services one program run uses.
type Set struct {
	RedisURL    string
	PostgresURL string
	S3          testenv.S3
	// Used says, one line per service, what was used and where it came from.
	Used []string
	// RedisStarted, PostgresStarted and S3Started say which servers
	// Provide started itself: they stop with Close, and what they hold
	// goes with them (unless Config.Keep).
	RedisStarted, PostgresStarted, S3Started bool
	// Dirs are the data directories of the servers Provide started.
	Dirs []string

	// EtcdEndpoints and ZooKeeperServers are set when Config asked for
	// etcd or ZooKeeper; EtcdStarted and ZooKeeperStarted say that Provide
	// started the server itself.
	EtcdEndpoints                 []string
	ZooKeeperServers              []string
	EtcdStarted, ZooKeeperStarted bool
	// ZooKeeperTick is the tickTime of the ZooKeeper server Provide
	// started (0 for one it found: it cannot tell). The server ends an
	// expired session at the next tick, so a holder that died keeps its
	// lease up to one tick past its session timeout.
	ZooKeeperTick time.Duration

	closers []func()
	dirs    *dataDirs
}

// Close stops whatever Provide started, in reverse order.
func (s *Set) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// Config overrides the environment. Empty fields fall back to it.
type Config struct {
	RedisURL    string
	PostgresURL string
	S3Endpoint  string
	// NoS3 skips the S3-compatible store, for programs that use only Redis
	// and PostgreSQL; Set.S3 is then left empty.
	NoS3 bool
	// NoRedis skips Redis, for programs whose leases live in PostgreSQL;
	// Set.RedisURL is then left empty.
	NoRedis bool
	// NoPostgres skips PostgreSQL, for programs whose leases and data
	// live elsewhere (Redis and MariaDB); Set.PostgresURL is then left
	// empty.
	NoPostgres bool
	// Etcd and ZooKeeper ask for those stores too, for programs whose
	// leases live there; EtcdEndpoints and ZooKeeperServers override
	// EtcdEndpointsVar and ZooKeeperServersVar (comma-separated lists).
	Etcd, ZooKeeper                 bool
	EtcdEndpoints, ZooKeeperServers string
	// Log receives progress lines (starting a server can take a while).
	Log func(format string, args ...any)
	// Keep keeps the data directories of the servers Provide starts
	// itself: Close stops the servers but leaves their directories (Used
	// names them).
	Keep bool
}

// Provide finds or starts every service. On error it has already stopped
// what it started.
func Provide(ctx context.Context, cfg Config) (*Set, error) {
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	s := &Set{dirs: &dataDirs{keep: cfg.Keep}}
	defer func() { s.Dirs = s.dirs.made }()
	var errs []error
	// Each in turn; none is looked for once ctx has ended (Ctrl-C while
	// one is being built or started).
	for _, svc := range []struct {
		want bool
		find func(context.Context, Config) error
	}{{!cfg.NoRedis, s.redis}, {!cfg.NoPostgres, s.postgres}, {cfg.Etcd, s.etcd}, {cfg.ZooKeeper, s.zookeeper}, {!cfg.NoS3, s.s3}} {
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("interrupted: %w", context.Cause(ctx)))
			break
		}
		if !svc.want {
			continue
		}
		if err := svc.find(ctx, cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Set) use(format string, args ...any) { s.Used = append(s.Used, fmt.Sprintf(format, args...)) }

func (s *Set) onClose(f func()) { s.closers = append(s.closers, f) }

func firstNonEmpty(vals ...string) (string, bool) {
	for i, v := range vals {
		if v != "" {
			return v, i < len(vals)-1
		}
	}
	return "", false
}

func (s *Set) redis(ctx context.Context, cfg Config) error {
	url, explicit := firstNonEmpty(cfg.RedisURL, os.Getenv(testenv.RedisURLVar), testenv.DefaultRedisURL)
	err := pingRedis(ctx, url)
	if err == nil {
		s.RedisURL = url
		s.use("Redis:      %s (%s)", url, origin(explicit, cfg.RedisURL != ""))
		return nil
	}
	answered := redisAnswered(err)
	if explicit {
		if answered {
			return fmt.Errorf("redis: the server at %s answered with an error: %w (fix the URL, or unset %s to let the demo find or start one)", url, err, testenv.RedisURLVar)
		}
		return fmt.Errorf("redis: %s does not answer: %w (start it, or unset %s to let the demo find or start one)", url, err, testenv.RedisURLVar)
	}
	why := "nothing answered at " + url
	if answered {
		why = fmt.Sprintf("the server at %s answered with an error: %v", url, err)
	}
	if path, lerr := exec.LookPath("redis-server"); lerr == nil {
		addr, stop, serr := startRedis(ctx, path, s.dirs)
		if serr == nil {
			s.onClose(stop)
			s.RedisURL, s.RedisStarted = "redis://"+addr+"/0", true
			s.use("Redis:      %s (redis-server started by this program; %s)", s.RedisURL, why)
			return nil
		}
		cfg.Log("could not start redis-server: %v", serr)
	}
	if dockerAnswers(ctx) {
		cfg.Log("starting Redis in Docker (testcontainers-go) ...")
		u, stop, derr := redisContainer(ctx)
		if derr == nil {
			s.onClose(stop)
			s.RedisURL = u
			s.use("Redis:      %s (Docker container via testcontainers-go)", u)
			return nil
		}
		cfg.Log("could not start Redis in Docker: %v", derr)
	}
	return fmt.Errorf("redis: %s, redis-server is not installed and Docker is not available: install Redis (Debian: apt-get install redis-server) or set %s", why, testenv.RedisURLVar)
}

func (s *Set) postgres(ctx context.Context, cfg Config) error {
	url, explicit := firstNonEmpty(cfg.PostgresURL, os.Getenv(testenv.PostgresURLVar), testenv.DefaultPostgresURL)
	err := pingPostgres(ctx, url)
	if err == nil {
		s.PostgresURL = url
		s.use("PostgreSQL: %s (%s)", redactURL(url), origin(explicit, cfg.PostgresURL != ""))
		return nil
	}
	var pgErr *pgconn.PgError
	answered := errors.As(err, &pgErr)
	if explicit {
		if answered {
			return fmt.Errorf("postgres: the server at %s answered but refused the connection: %w (fix the URL, or unset %s to let the demo find or start one)", redactURL(url), err, testenv.PostgresURLVar)
		}
		return fmt.Errorf("postgres: %s does not answer: %w (start it, or unset %s to let the demo find or start one)", redactURL(url), err, testenv.PostgresURLVar)
	}
	why := fmt.Sprintf("nothing answered at %s (%v)", redactURL(url), err)
	if answered {
		why = fmt.Sprintf("the server at %s answered but refused the connection: %v", redactURL(url), err)
	}
	if u, stop, serr := startPostgres(ctx, cfg.Log, s.dirs); serr == nil {
		s.onClose(stop)
		s.PostgresURL, s.PostgresStarted = u, true
		s.use("PostgreSQL: %s (throwaway cluster started by this program; %s)", u, why)
		return nil
	} else {
		cfg.Log("could not start a PostgreSQL cluster: %v", serr)
	}
	if dockerAnswers(ctx) {
		cfg.Log("starting PostgreSQL in Docker (testcontainers-go) ...")
		u, stop, derr := postgresContainer(ctx)
		if derr == nil {
			s.onClose(stop)
			s.PostgresURL = u
			s.use("PostgreSQL: %s (Docker container via testcontainers-go)", redactURL(u))
			return nil
		}
		cfg.Log("could not start PostgreSQL in Docker: %v", derr)
	}
	return fmt.Errorf("postgres: %s, no cluster could be started and Docker is not available: install PostgreSQL (Debian: apt-get install postgresql) or set %s", why, testenv.PostgresURLVar)
}

func (s *Set) s3(ctx context.Context, cfg Config) error {
	env := testenv.S3Config()
	if cfg.S3Endpoint != "" {
		env.Endpoint = cfg.S3Endpoint
	}
	if env.Bucket == "" {
		env.Bucket = "fencekit-demo"
	}
	if env.Endpoint != "" {
		if env.AccessKey == "" || env.SecretKey == "" {
			return fmt.Errorf("s3: %s is set, so %s and %s must be too", testenv.S3EndpointVar, testenv.S3AccessKeyVar, testenv.S3SecretKeyVar)
		}
		if err := createBucket(ctx, env); err != nil {
			return fmt.Errorf("s3: %s: %w", env.Endpoint, err)
		}
		s.S3 = env
		s.use("S3:         %s bucket %s (from %s)", env.Endpoint, env.Bucket, testenv.S3EndpointVar)
		return nil
	}
	env, stop, err := startVersitygw(ctx, env.Bucket, cfg.Log, s.dirs)
	if err != nil {
		return fmt.Errorf("s3: no %s set and versitygw could not be started: %w (set %s, %s, %s and %s to use your own S3-compatible store)",
			testenv.S3EndpointVar, err, testenv.S3EndpointVar, testenv.S3AccessKeyVar, testenv.S3SecretKeyVar, testenv.S3BucketVar)
	}
	s.onClose(stop)
	s.S3, s.S3Started = env, true
	s.use("S3:         %s bucket %s (versitygw %s started by this program)", env.Endpoint, env.Bucket, VersitygwVersion)
	return nil
}

func origin(fromEnvOrFlag, fromFlag bool) string {
	switch {
	case fromFlag:
		return "from the command line"
	case fromEnvOrFlag:
		return "from the environment"
	}
	return "the default local address"
}

func redactURL(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		if at := strings.Index(u[i+3:], "@"); at >= 0 {
			cred := u[i+3 : i+3+at]
			if c := strings.Index(cred, ":"); c >= 0 {
				return u[:i+3] + cred[:c] + ":***" + u[i+3+at:]
			}
		}
	}
	return u
}

// startProcess starts cmd with the parent-death signal sig (see package
// leftover: it dies with this program, however the program ends) and waits
// until ready returns true (polled every 50 ms) or timeout passes. stop
// interrupts it (SIGINT), kills it after 5 seconds, and waits for it.
func startProcess(ctx context.Context, cmd *exec.Cmd, sig syscall.Signal, timeout time.Duration, ready func() bool) (stop func(), err error) {
	// In a process group of its own: a Ctrl-C at the terminal reaches the
	// program, which then stops the server after cleaning up, instead of
	// the server dying first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, err := leftover.Start(cmd, sig)
	if err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		done()
		exited <- err
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		})
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return nil, fmt.Errorf("%s exited: %v", cmd.Path, err)
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if ready() {
			return stop, nil
		}
	}
	stop()
	return nil, fmt.Errorf("%s did not become ready within %v", cmd.Path, timeout)
}

// dataDirs makes the data directories of the servers Provide starts.
type dataDirs struct {
	keep bool     // Config.Keep: leave them when the servers stop
	made []string // every directory made, for Set.Dirs
}

// make makes a fencekit-<kind>- directory in the temporary directory,
// recorded in the run's ledger (package leftover). remove removes it,
// unless d.keep: then it stays, and leaves the ledger.
func (d *dataDirs) make(kind string) (dir string, remove func(), err error) {
	dir, err = os.MkdirTemp("", "fencekit-"+kind+"-")
	if err != nil {
		return "", nil, err
	}
	d.made = append(d.made, dir)
	done := leftover.Track(leftover.Entry{Kind: leftover.KindDir, Path: dir})
	return dir, func() {
		if d.keep || os.RemoveAll(dir) == nil {
			done()
		}
	}, nil
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func startRedis(ctx context.Context, bin string, dirs *dataDirs) (string, func(), error) {
	port, err := ports.Free()
	if err != nil {
		return "", nil, err
	}
	dir, removeDir, err := dirs.make("redis")
	if err != nil {
		return "", nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	stop, err := startProcess(ctx, cmd, syscall.SIGKILL, 10*time.Second, func() bool { return dialable(addr) })
	if err != nil {
		removeDir()
		return "", nil, err
	}
	return addr, func() { stop(); removeDir() }, nil
}

// redisAnswered reports whether err is an answer from a Redis server (an
// error reply such as NOAUTH or a bad database index), not a failure to
// reach one.
func redisAnswered(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

func dockerAnswers(ctx context.Context) bool {
	if _, err := exec.LookPath("docker"); err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "docker", "info").Run() == nil
}

// Redact returns the URL u with its password, if any, replaced by ***.
func Redact(u string) string { return redactURL(u) }
