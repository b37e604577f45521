package reliability

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencekit/fencekit/examples/services"
	"github.com/fencekit/fencekit/internal/testenv"
)

// binDir holds the helper programs under ../internal/..., built once by
// TestMain.
var binDir string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(mainM{m},
		// toxiproxy (a test tool, in-process here) leaves the goroutine of
		// a link's no-op stage blocked when a toxic is removed from a link
		// whose connection had closed meanwhile; fencekit's own goroutines
		// are all checked.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
		// A server started here (versitygw, when no S3 is given) is forked
		// from one goroutine locked to its thread for the life of the
		// process, so that the child's parent-death signal follows the
		// process, not a thread.
		goleak.IgnoreTopFunction("github.com/fencekit/fencekit/examples/internal/leftover.startSpawner.func1"),
	)
}

// mainM builds the helper programs and finds the services before the tests
// run; goleak checks for leaked goroutines once it returns.
type mainM struct{ m *testing.M }

func (w mainM) Run() int {
	dir, err := os.MkdirTemp("", "fencekit-reliability-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "reliability: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "../internal/pausedwriter")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "reliability: building the helper program: %v\n", err)
		return 1
	}
	binDir = dir

	svc, err := services.Provide(context.Background(), services.Config{
		Log: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "reliability: "+f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "reliability: %v\n", err)
		return 1
	}
	defer svc.Close()
	for k, v := range map[string]string{
		testenv.RedisURLVar: svc.RedisURL, testenv.PostgresURLVar: svc.PostgresURL,
		testenv.S3EndpointVar: svc.S3.Endpoint, testenv.S3AccessKeyVar: svc.S3.AccessKey,
		testenv.S3SecretKeyVar: svc.S3.SecretKey, testenv.S3BucketVar: svc.S3.Bucket,
	} {
		os.Setenv(k, v)
	}
	return w.m.Run()
}

func helperPath(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(binDir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("helper program %s was not built: %v", name, err)
	}
	return p
}
