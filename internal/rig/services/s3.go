package services

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/buildinfo"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/testkit/ports"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// VersitygwVersion is the versitygw release the programs build and start:
// the first that honours If-Match and If-None-Match on PutObject atomically.
const VersitygwVersion = "v1.8.0"

// NewS3Client returns an S3 client for env (path-style addressing, region
// us-east-1, static credentials).
func NewS3Client(env testenv.S3) *s3.Client { return NewS3ClientOver(env, nil) }

// NewS3ClientOver is NewS3Client sending its requests over rt (a
// transport the caller closes the idle connections of, or one that
// injects faults); over the SDK's own HTTP client when rt is nil.
func NewS3ClientOver(env testenv.S3, rt http.RoundTripper) *s3.Client {
	o := s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(env.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(env.AccessKey, env.SecretKey, ""),
	}
	if rt != nil {
		o.HTTPClient = &http.Client{Transport: rt}
	}
	return s3.New(o)
}

// EnsureBucket creates bucket through c unless it exists already. ctx
// bounds the request.
func EnsureBucket(ctx context.Context, c *s3.Client, bucket string) error {
	_, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	var ae smithy.APIError
	if errors.As(err, &ae) && (ae.ErrorCode() == "BucketAlreadyOwnedByYou" || ae.ErrorCode() == "BucketAlreadyExists") {
		return nil
	}
	return err
}

func createBucket(ctx context.Context, env testenv.S3) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return EnsureBucket(ctx, NewS3Client(env), env.Bucket)
}

// versitygwBinary returns a versitygw built at VersitygwVersion: the one in
// the user cache (shared with scripts/services.sh), else one on PATH of that
// version, else it builds it into the cache with go install (once).
func versitygwBinary(ctx context.Context, logf func(string, ...any)) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bindir := filepath.Join(cache, "fencekit", "bin")
	cached := filepath.Join(bindir, "versitygw")
	if isVersion(cached) {
		return cached, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil && isVersion(p) {
		return p, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("versitygw is not installed and the go command is not on PATH to build it")
	}
	logf("building versitygw %s into %s: once, later runs reuse it.", VersitygwVersion, bindir)
	logf("with an empty Go cache this downloads and compiles about 400 packages, some 130 CPU-seconds: measured 1.5 to 5 minutes on 2 cores, depending on what else runs ...")
	if err := os.MkdirAll(bindir, 0o755); err != nil {
		return "", err
	}
	// -v lists each package as it is compiled: the progress shown.
	cmd := exec.CommandContext(ctx, goBin, "install", "-v", "github.com/versity/versitygw/cmd/versitygw@"+VersitygwVersion)
	cmd.Dir = os.TempDir() // outside any module: its go.mod plays no part
	cmd.Env = append(os.Environ(), "GOBIN="+bindir, "GOWORK=off")
	if err := runBuild(ctx, cmd, "versitygw", logf); err != nil {
		return "", fmt.Errorf("go install versitygw@%s: %w", VersitygwVersion, err)
	}
	return cached, nil
}

// runBuild runs a go build or go install -v command made with
// exec.CommandContext(ctx, ...) (it dies with this program), logging its
// progress every 15 seconds as what it builds. It runs in a process group
// of its own: when ctx ends, the group gets SIGINT, so that the go command
// and the compilers and linker it started stop and the go command removes
// its work directory (SIGKILL after 10 seconds).
func runBuild(ctx context.Context, cmd *exec.Cmd, what string, logf func(string, ...any)) error {
	prog := &buildProgress{}
	cmd.Stdout, cmd.Stderr = prog, prog
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	done, err := leftover.Start(cmd, syscall.SIGKILL)
	if err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); done() }()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted: %w", ctx.Err())
			}
			if err != nil {
				return fmt.Errorf("%v: %s", err, prog.tail())
			}
			logf("built %s in %v", what, time.Since(start).Round(time.Second))
			return nil
		case <-tick.C:
			n, downloads, last := prog.counts()
			logf("building %s: %v, %d modules downloaded, %d packages compiled%s",
				what, time.Since(start).Round(time.Second), downloads, n, orEmpty(" (now: %s)", last))
		}
	}
}

// buildProgress counts what go install -v reports: "go: downloading"
// lines and compiled packages (one line each).
type buildProgress struct {
	mu        sync.Mutex
	partial   []byte
	packages  int
	downloads int
	last      string
	lines     []string // the last 20, for an error
}

func (p *buildProgress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		line := string(p.partial[:i])
		p.partial = p.partial[i+1:]
		switch {
		case strings.HasPrefix(line, "go: downloading "):
			p.downloads++
		case strings.HasPrefix(line, "go: "), strings.Contains(line, " "):
		default:
			p.packages++
			p.last = line
		}
		p.lines = append(p.lines, line)
		if len(p.lines) > 20 {
			p.lines = p.lines[1:]
		}
	}
	return len(b), nil
}

func (p *buildProgress) counts() (packages, downloads int, last string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.packages, p.downloads, p.last
}

// tail is the output's last lines that are not package names.
func (p *buildProgress) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, l := range p.lines {
		if strings.Contains(l, " ") || strings.HasPrefix(l, "go: ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

func orEmpty(format, s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf(format, s)
}

// isVersion reads versitygw's module version from the binary's build
// information.
func isVersion(bin string) bool {
	return hasModule(bin, "github.com/versity/versitygw", VersitygwVersion)
}

// hasModule reports whether the binary bin was built with module mod at
// version (read from its build information; no go command needed).
func hasModule(bin, mod, version string) bool {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return false
	}
	if info.Main.Path == mod {
		return info.Main.Version == version
	}
	for _, d := range info.Deps {
		if d.Path == mod {
			return d.Version == version
		}
	}
	return false
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startVersitygw starts versitygw with its posix backend over a temporary
// directory on a free loopback port, waits for /health and creates bucket.
func startVersitygw(ctx context.Context, bucket string, logf func(string, ...any), dirs *dataDirs) (testenv.S3, func(), error) {
	bin, err := versitygwBinary(ctx, logf)
	if err != nil {
		return testenv.S3{}, nil, err
	}
	dir, removeDir, err := dirs.make("s3")
	if err != nil {
		return testenv.S3{}, nil, err
	}
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		removeDir()
		return testenv.S3{}, nil, err
	}
	env := testenv.S3{AccessKey: "fencekit" + randomHex(6), SecretKey: randomHex(20), Bucket: bucket}
	port, err := ports.Free()
	if err != nil {
		removeDir()
		return testenv.S3{}, nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	env.Endpoint = "http://" + addr
	logFile, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		removeDir()
		return testenv.S3{}, nil, err
	}
	cmd := exec.Command(bin, "--port", addr, "--health", "/health", "--quiet", "posix", root)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+env.AccessKey, "ROOT_SECRET_ACCESS_KEY="+env.SecretKey)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	healthy := func() bool {
		resp, err := http.Get(env.Endpoint + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	stop, err := startProcess(ctx, cmd, syscall.SIGKILL, 15*time.Second, healthy)
	if err != nil {
		logFile.Close()
		log, _ := os.ReadFile(logFile.Name())
		removeDir()
		return testenv.S3{}, nil, fmt.Errorf("%w: %s", err, lastLine(string(log)))
	}
	cleanup := func() { stop(); logFile.Close(); removeDir() }
	if err := createBucket(ctx, env); err != nil {
		cleanup()
		return testenv.S3{}, nil, fmt.Errorf("create bucket %s: %w", bucket, err)
	}
	return env, cleanup, nil
}
