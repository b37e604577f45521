package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
)

// The report of a verify run: one HTML page, no script, with the verdict,
// the figures, each violation pointing at the grants and writes involved,
// a timeline of the holders, grants, writes and faults (inline SVG, with a
// tooltip on each element), and the history as tables.

// Report geometry, in pixels.
const (
	repWidth  = 1100
	repLeft   = 70
	repRight  = 20
	repTop    = 26
	repLane   = 36
	repBottom = 8
)

var outcomeColor = map[fence.Outcome]string{
	fence.Accepted: "#2a9d3a", fence.Rejected: "#e07b00", fence.Unknown: "#8a8a8a", fence.Failed: "#111",
}

// faultStyle is how the timeline draws a fault: its fill.
func faultStyle(kind string) string {
	switch {
	case kind == "sigstop":
		return "rgba(40,80,230,0.16)"
	case strings.HasPrefix(kind, "drop"):
		return "rgba(150,40,200,0.16)"
	case strings.HasPrefix(kind, "delay"):
		return "rgba(230,190,0,0.22)"
	case kind == faultPartition:
		return "rgba(240,120,0,0.13)"
	case kind == faultRestart:
		return "rgba(220,30,30,0.13)"
	}
	return "rgba(0,0,0,0.1)"
}

func esc(s string) string { return html.EscapeString(s) }

// recheck checks a recorded history again, and writes its report into
// out when it is not empty.
func recheck(path, out string, stdout, stderr io.Writer) int {
	h, err := readHistory(path)
	if err != nil {
		fmt.Fprintf(stderr, "fencekit verify --recheck: %v\n", err)
		return exitFail
	}
	sortHistory(h)
	if out == "" {
		return summarize(h, check(h), stdout, "", "")
	}
	return report(h, out, stdout, stderr, "-recheck")
}

// report checks h, writes its JSON and HTML into dir (the JSON only for a
// run, not a recheck), and summarizes it.
func report(h *verifyHistory, dir string, stdout, stderr io.Writer, suffix string) int {
	v := check(h)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintf(stderr, "fencekit verify: %v\n", err)
		return exitFail
	}
	base := filepath.Join(dir, "verify-"+h.Run.ID+suffix)
	jsonPath := ""
	if suffix == "" {
		jsonPath = base + ".json"
		if err := os.WriteFile(jsonPath, historyJSON(h), 0o644); err != nil {
			fmt.Fprintf(stderr, "fencekit verify: writing the history: %v\n", err)
			return exitFail
		}
	}
	var page bytes.Buffer
	if err := writeReport(&page, h, v); err != nil {
		fmt.Fprintf(stderr, "fencekit verify: the report: %v\n", err)
		return exitFail
	}
	if err := os.WriteFile(base+".html", page.Bytes(), 0o644); err != nil {
		fmt.Fprintf(stderr, "fencekit verify: writing the report: %v\n", err)
		return exitFail
	}
	return summarize(h, v, stdout, base+".html", jsonPath)
}

// summarize prints the verdict and returns the exit status.
func summarize(h *verifyHistory, v verdict, w io.Writer, htmlPath, jsonPath string) int {
	c := v.Counts
	faults := 0
	for _, n := range c.Faults {
		faults += n
	}
	what := fmt.Sprintf("%d grants (%d read valid) and %d writes (%d accepted, %d stale, %d unknown, %d failed), %d faults injected, %.1fs on %s (lease) and %s (writes)",
		c.Grants, v.Windows, c.Writes, c.Accepted, c.Stale, c.Unknown, c.Failed, faults, float64(h.Run.DurationNS)/1e9, h.Run.StoreDesc, h.Run.GuardDesc)
	code := exitOK
	switch {
	case len(v.Violations) > 0:
		fmt.Fprintf(w, "fencekit verify: FAILED: %d violations (%s) in %s\n", len(v.Violations), kindCounts(v.Violations), what)
		for i, x := range v.Violations[:min(len(v.Violations), maxListed)] {
			fmt.Fprintf(w, "  %d. %s: %s\n", i+1, x.Kind, x.Text)
		}
		if n := len(v.Violations) - maxListed; n > 0 {
			fmt.Fprintf(w, "  ... and %d more (the report lists them all)\n", n)
		}
		code = exitViolation
	case v.Inconclusive != "":
		fmt.Fprintf(w, "fencekit verify: INCONCLUSIVE: %s (%s)\n", v.Inconclusive, what)
		code = exitFail
	case h.Run.Interrupted:
		fmt.Fprintf(w, "fencekit verify: INTERRUPTED: no violation in what ran: %s\n", what)
		code = exitFail
	default:
		fmt.Fprintf(w, "fencekit verify: PASSED: no violation in %s\n", what)
	}
	if h.Run.Plant != "" {
		fmt.Fprintf(w, "  (test equipment: the workers ran with the planted bug %s)\n", h.Run.Plant)
	}
	if htmlPath != "" {
		fmt.Fprintf(w, "report:  %s\n", htmlPath)
	}
	if jsonPath != "" {
		fmt.Fprintf(w, "history: %s (fencekit verify --recheck %s)\n", jsonPath, jsonPath)
	}
	return code
}

// kindCounts says how many violations of each kind there are: "two
// holders at once: 3, token order: 1".
func kindCounts(vs []violation) string {
	var parts []string
	for _, k := range []string{vExclusion, vTokens, vDeadline, vWrites, vStale, vLost, vMalformed} {
		n := 0
		for _, x := range vs {
			if x.Kind == k {
				n++
			}
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d", k, n))
		}
	}
	return strings.Join(parts, ", ")
}

// historyJSON is h as the file holds it: one grant, write or fault a line.
func historyJSON(h *verifyHistory) []byte {
	var b bytes.Buffer
	line := func(v any) []byte { x, _ := json.Marshal(v); return x }
	list := func(name string, n int, item func(i int) any, last bool) {
		fmt.Fprintf(&b, "  %q: [", name)
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("\n    ")
			b.Write(line(item(i)))
		}
		if n > 0 {
			b.WriteString("\n  ")
		}
		b.WriteString("]")
		if !last {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "{\n  \"format\": %s,\n  \"run\": %s,\n", line(h.Format), line(h.Run))
	list("grants", len(h.Grants), func(i int) any { return h.Grants[i] }, false)
	list("writes", len(h.Writes), func(i int) any { return h.Writes[i] }, false)
	list("faults", len(h.Faults), func(i int) any { return h.Faults[i] }, false)
	fmt.Fprintf(&b, "  \"initial\": %s,\n  \"final\": %s", line(h.Initial), line(h.Final))
	if h.FinalError != "" {
		fmt.Fprintf(&b, ",\n  \"final_error\": %s", line(h.FinalError))
	}
	b.WriteString("\n}\n")
	return b.Bytes()
}

func writeReport(w io.Writer, h *verifyHistory, v verdict) error {
	var b strings.Builder
	status, color := "PASSED", "#2a9d3a"
	switch {
	case len(v.Violations) > 0:
		status, color = fmt.Sprintf("FAILED: %d violations", len(v.Violations)), "#c62828"
	case v.Inconclusive != "":
		status, color = "INCONCLUSIVE", "#8a6d00"
	case h.Run.Interrupted:
		status, color = "INTERRUPTED", "#8a6d00"
	}
	badGrant, badWrite := map[int][]int{}, map[int][]int{}
	for i, x := range v.Violations {
		for _, g := range x.Grants {
			badGrant[g] = append(badGrant[g], i+1)
		}
		for _, o := range x.Writes {
			badWrite[o] = append(badWrite[o], i+1)
		}
	}

	fmt.Fprintf(&b, `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>fencekit verify %s: %s</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12.5px}td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fde2e2}.status{color:%s;font-weight:bold}
.key span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:12px;height:12px;vertical-align:-2px;margin-right:4px}
code{font-size:12.5px}ol li{margin-bottom:6px}
</style></head><body>
`, esc(h.Run.ID), esc(status), color)
	fmt.Fprintf(&b, "<h1>fencekit verify: <span class=\"status\">%s</span></h1>\n", esc(status))
	if h.Run.Plant != "" {
		fmt.Fprintf(&b, "<p><b>Test equipment:</b> the workers ran with the planted bug <code>%s</code>: this run checked the checks, not a deployment.</p>\n", esc(h.Run.Plant))
	}
	if v.Inconclusive != "" {
		fmt.Fprintf(&b, "<p><b>Inconclusive:</b> %s</p>\n", esc(v.Inconclusive))
	}

	// The figures.
	c := v.Counts
	faults := 0
	var kinds []string
	for k, n := range c.Faults {
		faults += n
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kinds)
	rows := [][2]string{
		{"run", h.Run.ID + ", started " + h.Run.Started.Format(time.RFC3339) + ", " + h.Run.Fencekit},
		{"lease store", fmt.Sprintf("%s: lease %q, TTL %v", h.Run.StoreDesc, h.Run.Lease, time.Duration(h.Run.TTLNS))},
		{"guarded writes", h.Run.GuardDesc + ": " + h.Run.Resource},
		{"ran", fmt.Sprintf("%.1f s of %v asked, %d workers at a time (seed %d)", float64(h.Run.DurationNS)/1e9, time.Duration(h.Run.RequestedNS), h.Run.Workers, h.Run.Seed)},
		{"grants", fmt.Sprintf("%d (%d read valid at least once)", c.Grants, v.Windows)},
		{"writes", fmt.Sprintf("%d: %d accepted, %d stale, %d unknown, %d failed", c.Writes, c.Accepted, c.Stale, c.Unknown, c.Failed)},
		{"faults", fmt.Sprintf("%d: %s (kinds enabled: %s)", faults, strings.Join(kinds, ", "), faultList(h.Run.Faults))},
		{"final state", fmt.Sprintf("token %d, value %q", h.Final.Token, h.Final.Value)},
		{"violations", fmt.Sprint(len(v.Violations))},
		{"clock", fmt.Sprintf("the wall clock moved %v against the monotonic clock during the run", time.Duration(h.Run.ClockDriftNS))},
	}
	if h.FinalError != "" {
		rows[7][1] = "not read: " + h.FinalError
	}
	b.WriteString("<h2>Figures</h2>\n<table>\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "<tr><th>%s</th><td>%s</td></tr>\n", esc(r[0]), esc(r[1]))
	}
	b.WriteString("</table>\n")

	// The violations.
	if len(v.Violations) > 0 {
		b.WriteString("<h2>Violations</h2>\n<ol>\n")
		for _, x := range v.Violations {
			var refs []string
			for _, g := range x.Grants {
				refs = append(refs, fmt.Sprintf(`<a href="#%s">%s</a>`, gid(g), gid(g)))
			}
			for _, o := range x.Writes {
				refs = append(refs, fmt.Sprintf(`<a href="#%s">%s</a>`, wid(o), wid(o)))
			}
			fmt.Fprintf(&b, "<li><b>%s</b>: %s", esc(x.Kind), esc(x.Text))
			if len(refs) > 0 {
				fmt.Fprintf(&b, " (%s)", strings.Join(refs, ", "))
			}
			b.WriteString("</li>\n")
		}
		b.WriteString("</ol>\n")
	}

	b.WriteString("<h2>Timeline</h2>\n")
	b.WriteString(`<p class="key"><span><i class="sw" style="background:#5b8bd9"></i>grant, from its Acquire to its holder's last valid reading (thin: until it ended)</span>` +
		`<span><i class="sw" style="background:#2a9d3a"></i>write accepted</span><span><i class="sw" style="background:#e07b00"></i>stale</span>` +
		`<span><i class="sw" style="background:#8a8a8a"></i>unknown</span><span><i class="sw" style="background:#111"></i>failed</span>` +
		`<span><i class="sw" style="background:rgba(40,80,230,0.3)"></i>SIGSTOP</span><span><i class="sw" style="background:rgba(150,40,200,0.3)"></i>dropped</span>` +
		`<span><i class="sw" style="background:rgba(230,190,0,0.4)"></i>delayed</span><span style="color:#c00">✕ SIGKILL</span>` +
		`<span><i class="sw" style="border:2px solid #c00"></i>violation</span></p>` + "\n")
	writeTimeline(&b, h, v, badGrant, badWrite)

	// The history.
	b.WriteString("<h2>Grants</h2>\n<table>\n<tr><th>id</th><th>worker</th><th>token</th><th>acquired</th><th>last valid</th><th>deadline then</th><th>ended</th><th>how</th></tr>\n")
	for i, g := range h.Grants {
		cls := ""
		if len(badGrant[i]) > 0 {
			cls = ` class="bad"`
		}
		last, dl := "never", ""
		if g.LastValid >= 0 {
			last = at(g.LastValid)
		}
		if g.Deadline != 0 {
			dl = at(g.Deadline)
		}
		how := g.How
		if g.Err != "" {
			how += ": " + g.Err
		}
		fmt.Fprintf(&b, `<tr id="%s"%s><td>%s%s</td><td>%s</td><td class="n">%d</td><td class="n">%s</td><td class="n">%s</td><td class="n">%s</td><td class="n">%s</td><td>%s</td></tr>`+"\n",
			gid(i), cls, gid(i), marks(badGrant[i]), esc(g.Worker), g.Token, at(g.Acquired), last, dl, endAt(g.Ended), esc(how))
	}
	b.WriteString("</table>\n")

	// The writes worth reading: every one not plainly accepted, those a
	// violation points at, and the one the final state shows. The
	// timeline has a tooltip on each, and the JSON has them all.
	listed := 0
	for i, x := range h.Writes {
		if x.Outcome != fence.Accepted || len(badWrite[i]) > 0 || x.Value == h.Final.Value {
			listed++
		}
	}
	fmt.Fprintf(&b, "<h2>Writes</h2>\n<p>%d of %d: those not plainly accepted, those a violation points at, and the one the final state shows (the timeline has every write; the JSON too).</p>\n", listed, len(h.Writes))
	b.WriteString("<table>\n<tr><th>id</th><th>worker</th><th>token</th><th>value</th><th>lease read valid</th><th>called</th><th>returned</th><th>outcome</th><th>error</th></tr>\n")
	for i, x := range h.Writes {
		if x.Outcome == fence.Accepted && len(badWrite[i]) == 0 && x.Value != h.Final.Value {
			continue
		}
		cls := ""
		if len(badWrite[i]) > 0 {
			cls = ` class="bad"`
		}
		out := string(x.Outcome)
		if x.Outcome == fence.Rejected {
			out += fmt.Sprintf(" (current %d)", x.Current)
		}
		fmt.Fprintf(&b, `<tr id="%s"%s><td>%s%s</td><td>%s</td><td class="n">%d</td><td>%s</td><td class="n">%s</td><td class="n">%s</td><td class="n">%s</td><td style="color:%s">%s</td><td>%s</td></tr>`+"\n",
			wid(i), cls, wid(i), marks(badWrite[i]), esc(x.Worker), x.Token, esc(x.Value), at(x.Checked), at(x.Call), endAt(x.Return), outcomeColor[x.Outcome], esc(out), esc(shorten(x.Err, 160)))
	}
	b.WriteString("</table>\n")

	if len(h.Faults) > 0 {
		b.WriteString("<h2>Faults</h2>\n<table>\n<tr><th>kind</th><th>worker</th><th>target</th><th>from</th><th>to</th><th>detail</th></tr>\n")
		for _, f := range h.Faults {
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td><td>%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td>%s</td></tr>\n",
				esc(f.Kind), esc(f.Worker), esc(f.Target), at(f.Start), endAt(f.End), esc(shorten(f.Detail, 300)))
		}
		b.WriteString("</table>\n")
	}
	fmt.Fprintf(&b, "<p>Times are seconds since the run started. The raw history is <code>verify-%s.json</code>; <code>fencekit verify --recheck verify-%s.json</code> checks it again.</p>\n</body></html>\n",
		esc(h.Run.ID), esc(h.Run.ID))
	_, err := io.WriteString(w, b.String())
	return err
}

// marks are the violation numbers next to an id.
func marks(vs []int) string {
	if len(vs) == 0 {
		return ""
	}
	s := make([]string, len(vs))
	for i, n := range vs {
		s[i] = fmt.Sprintf("V%d", n)
	}
	return ` <b style="color:#c00">` + strings.Join(s, " ") + "</b>"
}

func endAt(ns int64) string {
	if ns < 0 {
		return "-"
	}
	return at(ns)
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// writeTimeline draws the run: a lane per worker.
func writeTimeline(b *strings.Builder, h *verifyHistory, v verdict, badGrant, badWrite map[int][]int) {
	var lanes []string
	lane := map[string]int{}
	add := func(w string) {
		if _, ok := lane[w]; !ok && w != "" {
			lane[w] = len(lanes)
			lanes = append(lanes, w)
		}
	}
	end := h.Run.DurationNS
	for _, g := range h.Grants {
		add(g.Worker)
		end = max(end, g.Ended, g.LastValid)
	}
	for _, x := range h.Writes {
		add(x.Worker)
		end = max(end, x.Return)
	}
	for _, f := range h.Faults {
		add(f.Worker)
		end = max(end, f.End)
	}
	slices.SortFunc(lanes, func(a, b string) int { return cmpWorker(a, b) })
	for i, w := range lanes {
		lane[w] = i
	}
	if end <= 0 {
		end = 1
	}
	plot := float64(repWidth - repLeft - repRight)
	x := func(t int64) float64 { return repLeft + float64(max(t, 0))/float64(end)*plot }
	height := repTop + len(lanes)*repLane + repBottom
	top := func(w string) int { return repTop + lane[w]*repLane }

	fmt.Fprintf(b, `<div style="overflow-x:auto"><svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-size="11" font-family="system-ui,sans-serif">`+"\n", repWidth, height)
	// Writes by outcome: accepted, stale, unknown, failed.
	fmt.Fprintf(b, "<style>path{stroke-width:1.5}.a{stroke:%s}.s{stroke:%s}.u{stroke:%s}.f{stroke:%s}</style>\n",
		outcomeColor[fence.Accepted], outcomeColor[fence.Rejected], outcomeColor[fence.Unknown], outcomeColor[fence.Failed])
	// The time axis.
	step := tickStep(float64(end) / 1e9)
	for s := 0.0; s*1e9 <= float64(end); s += step {
		px := x(int64(s * 1e9))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/><text x="%.1f" y="14" text-anchor="middle" fill="#666">%gs</text>`+"\n",
			px, repTop-4, px, height-repBottom, px, math.Round(s*1000)/1000)
	}
	for i, w := range lanes {
		y := repTop + i*repLane
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/><text x="6" y="%d" fill="#333">worker %s</text>`+"\n",
			repLeft, y+repLane, repWidth-repRight, y+repLane, y+21, esc(w))
	}
	// Faults first, under everything.
	for _, f := range h.Faults {
		fEnd := f.End
		if fEnd < 0 {
			fEnd = end
		}
		title := fmt.Sprintf("%s %s %s..%s %s", f.Kind, f.Target, at(f.Start), endAt(f.End), f.Detail)
		switch {
		case f.Worker == "":
			fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>`+"\n",
				x(f.Start), repTop, max(x(fEnd)-x(f.Start), 1), len(lanes)*repLane, faultStyle(f.Kind), esc(title))
		case f.Kind == "sigkill":
			px, y := x(f.Start), top(f.Worker)
			fmt.Fprintf(b, `<g stroke="#c00" stroke-width="2"><title>%s</title><line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/><line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/></g>`+"\n",
				esc(title), px-5, y+4, px+5, y+repLane-4, px-5, y+repLane-4, px+5, y+4)
		default:
			fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s</title></rect>`+"\n",
				x(f.Start), top(f.Worker)+1, max(x(fEnd)-x(f.Start), 1), repLane-2, faultStyle(f.Kind), esc(title))
		}
	}
	// Two holders at once: the overlap, across both lanes.
	for i, viol := range v.Violations {
		if viol.Kind != vExclusion || len(viol.Grants) != 2 {
			continue
		}
		first, second := h.Grants[viol.Grants[0]], h.Grants[viol.Grants[1]]
		for _, g := range []grantRec{first, second} {
			fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="rgba(220,0,0,0.25)"><title>V%d: both valid</title></rect>`+"\n",
				x(second.Acquired), top(g.Worker)+1, max(x(first.LastValid)-x(second.Acquired), 2), repLane-2, i+1)
		}
	}
	// Grants.
	for i, g := range h.Grants {
		y := top(g.Worker)
		fill := []string{"#5b8bd9", "#3f6fc0"}[i%2]
		stroke := ""
		if len(badGrant[i]) > 0 {
			stroke = ` stroke="#c00" stroke-width="2"`
		}
		last := "never read valid"
		if g.LastValid >= 0 {
			last = "last read valid " + at(g.LastValid)
		}
		title := fmt.Sprintf("%s: worker %s, token %d, acquired %s, %s, ended %s (%s)", gid(i), g.Worker, g.Token, at(g.Acquired), last, endAt(g.Ended), g.How)
		validEnd := max(g.LastValid, g.Acquired)
		fmt.Fprintf(b, `<g><title>%s</title><rect x="%.1f" y="%d" width="%.1f" height="14" fill="%s"%s/>`, esc(title), x(g.Acquired), y+4, max(x(validEnd)-x(g.Acquired), 1.5), fill, stroke)
		if g.Ended > validEnd {
			fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"/>`, x(validEnd), y+11, x(g.Ended), y+11, fill)
		}
		if x(validEnd)-x(g.Acquired) > 22 {
			fmt.Fprintf(b, `<text x="%.1f" y="%d" fill="#fff" font-size="10">%s</text>`, x(g.Acquired)+3, y+15, gid(i))
		}
		if len(badGrant[i]) > 0 {
			label := fmt.Sprintf("V%d", badGrant[i][0])
			if len(badGrant[i]) > 1 {
				label += "+"
			}
			fmt.Fprintf(b, `<text x="%.1f" y="%d" fill="#c00" font-weight="bold">%s<title>%s</title></text>`, x(g.Acquired), y+3, label, esc(vList(badGrant[i])))
		}
		b.WriteString("</g>\n")
	}
	// Writes.
	for i, w := range h.Writes {
		y := top(w.Worker)
		px := x(w.Call)
		title := fmt.Sprintf("%s %s token %d %s-%s", wid(i), w.Outcome, w.Token, at(w.Call), endAt(w.Return))
		fmt.Fprintf(b, `<path d="M%.1f %dv10" class="%c"><title>%s</title></path>`+"\n", px, y+21, string(w.Outcome)[0], esc(title))
		if len(badWrite[i]) > 0 {
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%d" r="6" fill="none" stroke="#c00" stroke-width="2"><title>%s %s</title></circle>`+"\n", px, y+26, esc(vList(badWrite[i])), esc(title))
		}
	}
	b.WriteString("</svg></div>\n")
}

func vList(vs []int) string {
	var s string
	for _, n := range vs {
		s += fmt.Sprintf("V%d ", n)
	}
	return s
}

// cmpWorker orders worker ids by number: w2 before w10.
func cmpWorker(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}

// tickStep is the time between two ticks of an axis of span seconds: 1, 2
// or 5 times a power of ten, for at most 15 ticks.
func tickStep(span float64) float64 {
	for p := 0.01; ; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if span/(m*p) <= 15 {
				return m * p
			}
		}
	}
}
