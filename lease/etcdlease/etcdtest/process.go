package etcdtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// memberPkg is the main package each member runs as (etcdtest/etcdmember).
const memberPkg = "github.com/fencekit/fencekit/lease/etcdlease/etcdtest/etcdmember"

// program is the member program, built once per process.
var program struct {
	once sync.Once
	path string
	err  error
}

// memberProgram returns the path of the member program, built (once per
// process) with go build: without the race detector whatever the test
// binary's flags, with the environment's GOFLAGS (the test script's
// -trimpath), so that its packages come from the build cache the test
// build filled. The go command finds the package from the test's module
// or workspace, as it found the test's own.
//
// The program lands in the user's cache directory under a name made of a
// hash of its source directory, so that test processes of one checkout
// share it and go build, finding it up to date, does not link it again
// (a link costs seconds of CPU); checkouts side by side each have their
// own. Test processes that start together build it one at a time.
func memberProgram() (string, error) {
	program.once.Do(func() { program.path, program.err = buildMember() })
	return program.path, program.err
}

func buildMember() (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", errors.New("the go command is not on PATH: it builds the etcd member program")
	}
	src, err := exec.Command(goBin, "list", "-f", "{{.Dir}}", memberPkg).Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %w%s", memberPkg, err, stderrOf(err))
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "fencekit", "etcdtest")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	sum := sha256.Sum256(bytes.TrimSpace(src))
	path := filepath.Join(dir, "etcdmember-"+hex.EncodeToString(sum[:8]))
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	out, err := exec.Command(goBin, "build", "-o", path, memberPkg).CombinedOutput()
	if err == nil {
		return path, nil
	}
	// Writing over a program that runs (a member of another test
	// process, started before its source changed) can fail where go
	// build copies instead of renaming: build beside it and rename over
	// it, which leaves the running one alone.
	tmp, terr := os.MkdirTemp(dir, "building-")
	if terr != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", memberPkg, err, out)
	}
	defer os.RemoveAll(tmp)
	built := filepath.Join(tmp, "etcdmember")
	if out, err := exec.Command(goBin, "build", "-o", built, memberPkg).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", memberPkg, err, out)
	}
	if err := os.Rename(built, path); err != nil {
		return "", err
	}
	return path, nil
}

// stderrOf returns what a failed command wrote to its standard error, if
// err says.
func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + string(bytes.TrimSpace(ee.Stderr))
	}
	return ""
}

// proc is a running member program.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // its output, a line at a time; closed when it exited
	stderr *tailBuffer
	done   chan struct{} // closed when it exited
	err    error         // how it exited, once done is closed

	qmu sync.Mutex // one question at a time
}

// startProc starts the member program with args and waits until the member
// serves; it returns the member's raft ID. The program dies with the test
// process (a parent death signal on Linux; everywhere, its input ends).
func startProc(args []string, within time.Duration) (*proc, uint64, error) {
	bin, err := memberProgram()
	if err != nil {
		return nil, 0, err
	}
	p := &proc{
		cmd:    exec.Command(bin, args...),
		lines:  make(chan string, 16),
		stderr: &tailBuffer{max: 4096},
		done:   make(chan struct{}),
	}
	p.cmd.Stdout = &lineWriter{lines: p.lines}
	p.cmd.Stderr = p.stderr
	dieWithParent(p.cmd)
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, 0, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, 0, err
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.lines) // Wait returns once the output is copied
		close(p.done)
	}()
	select {
	case line, ok := <-p.lines:
		if rest, found := strings.CutPrefix(line, "ready "); found && ok {
			id, err := strconv.ParseUint(rest, 16, 64)
			if err != nil {
				p.kill()
				return nil, 0, fmt.Errorf("member program: bad ready line %q", line)
			}
			return p, id, nil
		}
		p.kill()
		return nil, 0, p.exitError()
	case <-time.After(within + 5*time.Second):
		p.kill()
		return nil, 0, fmt.Errorf("not ready within %v", within)
	}
}

// exitError describes how the program ended (after done), with the end of
// its standard error.
func (p *proc) exitError() error {
	<-p.done
	return fmt.Errorf("member program exited (%v): %s", p.err, strings.TrimSpace(p.stderr.String()))
}

// exited reports whether the program has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// status returns the leader the member knows (0 if none) and its own ID,
// as its raft node has them.
func (p *proc) status() (lead, id uint64, err error) {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	// A reply to an earlier question that timed out may be waiting.
	for drained := false; !drained; {
		select {
		case _, ok := <-p.lines:
			if !ok {
				return 0, 0, p.exitError()
			}
		default:
			drained = true
		}
	}
	if _, err := io.WriteString(p.stdin, "status\n"); err != nil {
		if p.exited() {
			return 0, 0, p.exitError()
		}
		return 0, 0, fmt.Errorf("asking the member program: %w", err)
	}
	select {
	case line, ok := <-p.lines:
		if !ok {
			return 0, 0, p.exitError()
		}
		if _, err := fmt.Sscanf(line, "status %x %x", &lead, &id); err != nil {
			return 0, 0, fmt.Errorf("member program: bad status line %q: %w", line, err)
		}
		return lead, id, nil
	case <-time.After(5 * time.Second):
		return 0, 0, errors.New("member program: no answer to status within 5s")
	}
}

// stopTimeout bounds a graceful stop: etcd's own bounds (a leader's
// hand-over waits up to its request timeout, about 5 s) are far below it.
const stopTimeout = time.Minute

// stop stops the member the way etcd shuts down (embed's Close) and waits
// for the program to end; past stopTimeout it kills it.
func (p *proc) stop() {
	if _, err := io.WriteString(p.stdin, "stop\n"); err == nil {
		select {
		case <-p.done:
			return
		case <-time.After(stopTimeout):
		}
	}
	p.kill()
}

// kill kills the program at once (SIGKILL on Unix) and waits until it has
// ended.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// lineWriter sends what is written to it to lines, a line at a time,
// dropping lines nobody reads.
type lineWriter struct {
	lines   chan<- string
	partial []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := string(w.partial[:i])
		w.partial = w.partial[i+1:]
		select {
		case w.lines <- line:
		default:
		}
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, b...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = t.b[over:]
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
