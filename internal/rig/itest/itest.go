// Package itest is what the integration packages share: helper programs
// built once into a temporary directory by TestMain (the holder program,
// internal/rig/cmd/holder, started and read through StartHolder), and the
// services the tests (and their child processes) find through the FENCE_*
// variables.
package itest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/internal/rig/services"
	"github.com/fencekit/fencekit/internal/testkit/testenv"
)

// HolderPkg is the holder program's package, for Main's and Setup's
// helpers.
const HolderPkg = "github.com/fencekit/fencekit/internal/rig/cmd/holder"

// Main is an integration package's TestMain: it builds the helpers and
// provides the services (Setup, with who and cfg), runs the tests, cleans
// up, then checks for leaked goroutines with goleak, ignoring what ignore
// names and the spawner of package leftover (a server started here, such
// as versitygw when no S3 is given, is forked from one goroutine locked to
// its thread for the life of the process, so that the child's parent-death
// signal follows the process, not a thread). It returns the directory of
// the helper programs through binDir when that is not nil, and exits.
func Main(m *testing.M, who string, cfg services.Config, helpers []string, binDir *string, ignore ...goleak.Option) {
	ignore = append(ignore, goleak.IgnoreTopFunction("github.com/fencekit/fencekit/internal/rig/leftover.startSpawner.func1"))
	goleak.VerifyTestMain(mainM{m: m, run: func() int {
		dir, cleanup, err := Setup(who, cfg, helpers...)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", who, err)
			return 1
		}
		defer cleanup()
		if binDir != nil {
			*binDir = dir
		}
		return m.Run()
	}}, ignore...)
}

// mainM runs the tests between Setup and its cleanup; goleak checks for
// leaked goroutines once it returns.
type mainM struct {
	m   *testing.M
	run func() int
}

func (w mainM) Run() int { return w.run() }

// Setup builds the helper programs matched by the package patterns helpers
// (none: no build) into a new temporary directory, then provides the
// services: those in the environment (./scripts/test.sh exports them),
// else the default local ones, else servers started here (versitygw),
// else Docker containers through testcontainers-go. It exports FENCE_* for
// every service it provided (cfg says which), logs what it used with the
// prefix who, and returns the directory of the helper programs (which
// HolderPath and StartHolder use) and a cleanup that stops what it started
// and removes the directory.
func Setup(who string, cfg services.Config, helpers ...string) (binDir string, cleanup func(), err error) {
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, who+": "+f+"\n", a...) }
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	if len(helpers) > 0 {
		dir, err := os.MkdirTemp("", "fencekit-"+who+"-bin-")
		if err != nil {
			return "", cleanup, err
		}
		undo = append(undo, func() { os.RemoveAll(dir) })
		cmd := exec.Command("go", append([]string{"build", "-o", dir + string(filepath.Separator)}, helpers...)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			cleanup()
			return "", func() {}, fmt.Errorf("building the helper programs (go build %v): %w", helpers, err)
		}
		binDir = dir
		helperDir = dir
	}
	if cfg.Log == nil {
		cfg.Log = logf
	}
	svc, err := services.Provide(context.Background(), cfg)
	if err != nil {
		cleanup()
		return "", func() {}, err
	}
	undo = append(undo, svc.Close)
	for k, v := range map[string]string{
		testenv.RedisURLVar: svc.RedisURL, testenv.PostgresURLVar: svc.PostgresURL,
		testenv.S3EndpointVar: svc.S3.Endpoint, testenv.S3AccessKeyVar: svc.S3.AccessKey,
		testenv.S3SecretKeyVar: svc.S3.SecretKey, testenv.S3BucketVar: svc.S3.Bucket,
	} {
		if v != "" {
			os.Setenv(k, v)
		}
	}
	for _, u := range svc.Used {
		logf("%s", u)
	}
	return binDir, cleanup, nil
}

// helperDir is the directory of the helper programs Setup built.
var helperDir string

// HelperPath returns the path of the helper program name in binDir (from
// Setup), failing t if it was not built.
func HelperPath(t testing.TB, binDir, name string) string {
	t.Helper()
	p := filepath.Join(binDir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("helper program %s was not built: %v", name, err)
	}
	return p
}
