//go:build ignore

// Docscheck checks the repository's documentation against the repository.
// scripts/test.sh runs it from the repository's root:
//
//	go run scripts/docscheck.go
//
// It prints every problem and exits 1 if there is one. The checks:
//
//   - CONTRIBUTING.md's module list (the table under "## Modules") names
//     every module of go.work, and nothing else;
//   - every relative link of every Markdown file resolves: the file or
//     directory exists, and a #fragment names a heading of the target
//     page (GitHub's anchors);
//   - no Go, Markdown, SQL or shell file cites a DESIGN.md (the design
//     document is docs/design.md) or an issue number of this project's
//     tracker ("issue 19"): comments and docs say what a thing is.
package main

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

func main() {
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	checkModules(report)

	files, err := sourceFiles(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "docscheck:", err)
		os.Exit(1)
	}
	anchors := map[string]map[string]bool{} // Markdown file -> its headings' anchors
	for _, f := range files {
		if strings.HasSuffix(f, ".md") {
			checkLinks(f, anchors, report)
		}
		checkCitations(f, report)
	}

	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "docscheck:", p)
		}
		fmt.Fprintf(os.Stderr, "docscheck: %d problem(s)\n", len(problems))
		os.Exit(1)
	}
	fmt.Printf("docscheck: ok (%d files)\n", len(files))
}

// sourceFiles returns the Markdown, Go, SQL and shell files under root,
// leaving out version control, dependencies and raw benchmark output.
func sourceFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".md", ".go", ".sql", ".sh":
			files = append(files, path)
		}
		return nil
	})
	return files, err
}

// checkModules compares CONTRIBUTING.md's module table with go.work's use
// directives.
func checkModules(report func(string, ...any)) {
	work, err := workModules("go.work")
	if err != nil {
		report("%v", err)
		return
	}
	listed, err := contributingModules("CONTRIBUTING.md")
	if err != nil {
		report("%v", err)
		return
	}
	for _, m := range work {
		if !slices.Contains(listed, m) {
			report("CONTRIBUTING.md: the module list (## Modules) misses %s, a module of go.work", m)
		}
	}
	for _, m := range listed {
		if !slices.Contains(work, m) {
			report("CONTRIBUTING.md: the module list (## Modules) names %s, which go.work does not use", m)
		}
	}
}

// workModules returns the directories go.work uses, cleaned ("." for the
// root).
func workModules(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var dirs []string
	inUse := false
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "use (":
			inUse = true
		case inUse && line == ")":
			inUse = false
		case inUse && line != "":
			dirs = append(dirs, filepath.Clean(line))
		case strings.HasPrefix(line, "use ") && !strings.HasSuffix(line, "("):
			dirs = append(dirs, filepath.Clean(strings.TrimSpace(strings.TrimPrefix(line, "use "))))
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("%s: no use directive found", path)
	}
	return dirs, nil
}

// contributingModules returns the first cell of each row of the table
// under "## Modules" in path, without its backquotes.
func contributingModules(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var mods []string
	in := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = strings.TrimSpace(line) == "## Modules"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.TrimSpace(strings.SplitN(line[1:], "|", 2)[0])
		mods = append(mods, filepath.Clean(strings.Trim(cell, "`")))
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("%s: no module table under \"## Modules\" (rows of the form | `dir` | ... |)", path)
	}
	return mods, nil
}

var (
	linkRE   = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeRE   = regexp.MustCompile("`[^`]*`")
	schemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// checkLinks reports every relative link of the Markdown file path that
// does not resolve.
func checkLinks(path string, anchors map[string]map[string]bool, report func(string, ...any)) {
	lines, err := proseLines(path)
	if err != nil {
		report("%v", err)
		return
	}
	for _, l := range lines {
		for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(l.text, ""), -1) {
			target := m[1]
			if schemeRE.MatchString(target) {
				continue
			}
			file, fragment, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), file)
				if _, err := os.Stat(dest); err != nil {
					report("%s:%d: link %s: %s does not exist", path, l.n, target, dest)
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if anchors[dest] == nil {
				a, err := headingAnchors(dest)
				if err != nil {
					report("%v", err)
					continue
				}
				anchors[dest] = a
			}
			if !anchors[dest][fragment] {
				report("%s:%d: link %s: %s has no heading with the anchor #%s", path, l.n, target, dest, fragment)
			}
		}
	}
}

type line struct {
	n    int
	text string
}

// proseLines returns the lines of a Markdown file outside fenced code
// blocks, with their numbers.
func proseLines(path string) ([]line, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []line
	fence := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		t := sc.Text()
		trimmed := strings.TrimSpace(t)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		out = append(out, line{n, t})
	}
	return out, sc.Err()
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file: lower case, punctuation dropped, spaces turned into
// hyphens, a repeated anchor suffixed -1, -2, ...
func headingAnchors(path string) (map[string]bool, error) {
	lines, err := proseLines(path)
	if err != nil {
		return nil, err
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, l := range lines {
		if !strings.HasPrefix(l.text, "#") {
			continue
		}
		title := strings.TrimLeft(l.text, "#")
		if title == "" || title[0] != ' ' {
			continue
		}
		slug := slugify(strings.TrimSpace(title))
		if k := seen[slug]; k > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors, nil
}

func slugify(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

var (
	designRE = regexp.MustCompile(`\bDESIGN\.md\b`)
	issueRE  = regexp.MustCompile(`(?i)(\S+\s+)?\bissues?\s+#?[0-9]+`)
	// Trackers of other projects, whose issues a comment may cite.
	otherTrackers = []string{"go-redis"}
)

// checkCitations reports citations of a DESIGN.md and of this project's
// issue numbers.
func checkCitations(path string, report func(string, ...any)) {
	if filepath.Base(path) == "docscheck.go" && filepath.Base(filepath.Dir(path)) == "scripts" {
		return // this file names what it looks for
	}
	data, err := os.ReadFile(path)
	if err != nil {
		report("%v", err)
		return
	}
	for i, text := range strings.Split(string(data), "\n") {
		if designRE.MatchString(text) {
			report("%s:%d: cites DESIGN.md; the design document is docs/design.md", path, i+1)
		}
		for _, m := range issueRE.FindAllStringSubmatch(text, -1) {
			if slices.Contains(otherTrackers, strings.TrimLeft(strings.TrimSpace(m[1]), "([\"'`")) {
				continue
			}
			report("%s:%d: %q: say what the thing is, not which issue asked for it", path, i+1, strings.TrimSpace(m[0]))
		}
	}
}
