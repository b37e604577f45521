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
	"time"
)

// startPostgres creates a throwaway cluster with initdb in a temporary
// directory and starts it with pg_ctl on a free loopback port, trust auth.
func startPostgres(ctx context.Context, logf func(string, ...any)) (string, func(), error) {
	if os.Geteuid() == 0 {
		return "", nil, errors.New("initdb refuses to run as root")
	}
	initdb, err := findPGBin("initdb")
	if err != nil {
		return "", nil, err
	}
	pgctl := filepath.Join(filepath.Dir(initdb), "pg_ctl")
	dir, err := os.MkdirTemp("", "fencekit-pg-")
	if err != nil {
		return "", nil, err
	}
	data := filepath.Join(dir, "data")
	logf("creating a throwaway PostgreSQL cluster in %s ...", dir)
	if out, err := exec.CommandContext(ctx, initdb, "-D", data, "-U", "postgres", "--auth=trust", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s -c fsync=off", port, dir)
	if out, err := exec.CommandContext(ctx, pgctl, "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "30", "start").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("pg_ctl start: %v: %s", err, out)
	}
	stop := func() {
		_ = exec.Command(pgctl, "-D", data, "-m", "immediate", "-w", "stop").Run()
		os.RemoveAll(dir)
	}
	url := "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable"
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := pingPostgres(ctx, url); err == nil {
			return url, stop, nil
		} else if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("the new cluster does not answer: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
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
