package services

import (
	"strings"
	"testing"
)

// TestBuildProgressCounts feeds buildProgress what go install -v prints,
// split at arbitrary points, and checks what the progress lines report.
func TestBuildProgressCounts(t *testing.T) {
	out := "go: downloading github.com/versity/versitygw v1.8.0\n" +
		"go: downloading github.com/gofiber/fiber/v3 v3.5.0\n" +
		"internal/goarch\n" +
		"github.com/gofiber/fiber/v3\n" +
		"# github.com/versity/versitygw/backend/posix\n" +
		"backend/posix/posix.go:1:1: something failed\n" +
		"github.com/versity/versitygw/cmd/versitygw\n"
	p := &buildProgress{}
	for len(out) > 0 {
		n := min(7, len(out))
		if _, err := p.Write([]byte(out[:n])); err != nil {
			t.Fatal(err)
		}
		out = out[n:]
	}
	pkgs, downloads, last := p.counts()
	if pkgs != 3 || downloads != 2 || last != "github.com/versity/versitygw/cmd/versitygw" {
		t.Errorf("counts = %d packages, %d downloads, last %q; want 3, 2, the command", pkgs, downloads, last)
	}
	if tail := p.tail(); !strings.Contains(tail, "something failed") || strings.Contains(tail, "internal/goarch") {
		t.Errorf("tail %q: want the error lines, not the package names", tail)
	}
}
