//go:build unix

package ports

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// A port reserved by one process is passed over by every other while the
// first lives: the child process (this test binary again) is refused the
// port the test reserved, and given one nobody reserved.
func TestReservedPortIsRefusedToAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	const port = 15001
	if mine, err := reserve(dir, port); err != nil || !mine {
		t.Fatalf("reserve(%d) = %v, %v; want true", port, mine, err)
	}
	for _, c := range []struct {
		port int
		want string
	}{{port, "false"}, {port + 1, "true"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReserveChild$")
		cmd.Env = append(os.Environ(), "FENCEKIT_PORTS_RESERVE="+dir+"|"+strconv.Itoa(c.port))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child process: %v: %s", err, out)
		}
		if got := strings.Fields(string(out)); len(got) == 0 || got[0] != c.want {
			t.Fatalf("another process reserving port %d got %q, want %s", c.port, out, c.want)
		}
	}
}

// TestReserveChild is the child of TestReservedPortIsRefusedToAnotherProcess
// (it does nothing unless FENCEKIT_PORTS_RESERVE is set): it prints whether it
// could reserve the port.
func TestReserveChild(t *testing.T) {
	arg, ok := os.LookupEnv("FENCEKIT_PORTS_RESERVE")
	if !ok {
		return
	}
	dir, p, _ := strings.Cut(arg, "|")
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := reserve(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(mine)
}
