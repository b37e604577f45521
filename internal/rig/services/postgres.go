package services

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/fencekit/fencekit/internal/testkit/ports"
)

// startPostgres creates a throwaway cluster with initdb in a temporary
// directory and runs its server (postgres, not pg_ctl, so that it is this
// program's child and dies with it: its parent-death signal is SIGQUIT,
// PostgreSQL's immediate shutdown) on a free loopback port, trust auth.
func startPostgres(ctx context.Context, logf func(string, ...any), dirs *dataDirs) (string, func(), error) {
	if os.Geteuid() == 0 {
		return "", nil, errors.New("initdb refuses to run as root")
	}
	initdb, err := findPGBin("initdb")
	if err != nil {
		return "", nil, err
	}
	postgres := filepath.Join(filepath.Dir(initdb), "postgres")
	dir, removeDir, err := dirs.make("pg")
	if err != nil {
		return "", nil, err
	}
	data := filepath.Join(dir, "data")
	logf("creating a throwaway PostgreSQL cluster in %s ...", dir)
	if out, err := exec.CommandContext(ctx, initdb, "-D", data, "-U", "postgres", "--auth=trust", "--no-sync").CombinedOutput(); err != nil {
		removeDir()
		return "", nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	port, err := ports.Free()
	if err != nil {
		removeDir()
		return "", nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		removeDir()
		return "", nil, err
	}
	url := "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable"
	cmd := exec.Command(postgres, "-D", data, "-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1",
		"-k", dir, "-c", "fsync=off")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// SIGINT (stop's signal) is PostgreSQL's fast shutdown.
	stop, err := startProcess(ctx, cmd, syscall.SIGQUIT, 30*time.Second, func() bool { return pingPostgres(ctx, url) == nil })
	if err != nil {
		logFile.Close()
		log, _ := os.ReadFile(logFile.Name())
		removeDir()
		return "", nil, fmt.Errorf("%w: %s", err, lastLine(string(log)))
	}
	return url, func() { stop(); logFile.Close(); removeDir() }, nil
}

// findPGBin looks for a PostgreSQL server program on PATH, then where Debian
// and Ubuntu install it (/usr/lib/postgresql/N/bin), newest first.
func findPGBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	sort.Slice(matches, func(i, j int) bool { return version(matches[i]) > version(matches[j]) })
	if len(matches) > 0 {
		return matches[0], nil
	}
	return "", fmt.Errorf("%s not found on PATH or in /usr/lib/postgresql/*/bin", name)
}

func version(binPath string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(binPath))))
	return n
}
