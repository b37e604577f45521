package jobnames

import (
	"strconv"
	"testing"
)

// The first Max names keep their own label, every later one gets Other,
// and a name keeps the label it got first.
func TestLabelBoundsTheNames(t *testing.T) {
	var n Names
	for i := range Max {
		if got := n.Label("job-" + strconv.Itoa(i)); got != "job-"+strconv.Itoa(i) {
			t.Fatalf("name %d labelled %q, want its own name", i, got)
		}
	}
	if got := n.Label("one-too-many"); got != Other {
		t.Fatalf("name %d labelled %q, want Other", Max+1, got)
	}
	if got := n.Label("job-0"); got != "job-0" {
		t.Fatalf("a known name labelled %q after the bound, want its own", got)
	}
	if got := n.Label("one-too-many"); got != Other {
		t.Fatalf("a name beyond the bound labelled %q the second time, want Other", got)
	}
}
