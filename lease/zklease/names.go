package zklease

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// escapeName turns a lease name into one node name: every byte outside
// [A-Za-z0-9_-] becomes %XX (upper-case hex). The encoding is injective, so
// names never share a parent, and the result contains no '/', no '.' and
// nothing ZooKeeper refuses in a path.
func escapeName(name string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(name))
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&0xf])
		}
	}
	return b.String()
}

// ParentPath returns the znode under which the nodes of lease name live:
// root + "/" + the name with every byte outside [A-Za-z0-9_-] written as
// %XX.
func ParentPath(root, name string) string { return root + "/" + escapeName(name) }

// A node's name is "<guid>-<sequence>": 32 hex digits chosen at random
// before the create (so that the creator can find its node again when the
// reply is lost), then the 10-digit sequence number ZooKeeper appends.
const guidLen = 32

func newGUID() string {
	var b [guidLen / 2]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// child is one node under a lease's parent.
type child struct {
	name string // the node name, without the parent
	guid string
	seq  int64
}

// parseChildren reads the names under a parent and sorts them by sequence
// number. A name that is not ours, or a sequence number that overflowed
// (ZooKeeper's counter is a signed 32-bit number per parent), is an error:
// the order of the queue could not be trusted.
func parseChildren(parent string, names []string) ([]child, error) {
	out := make([]child, 0, len(names))
	for _, n := range names {
		i := strings.IndexByte(n, '-')
		if i != guidLen {
			return nil, fmt.Errorf("zklease: %s/%s is not a node of this backend; the parent must hold only zklease nodes", parent, n)
		}
		seq, err := strconv.ParseInt(n[i+1:], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("zklease: %s/%s has no sequence number: %w", parent, n, err)
		}
		if seq < 0 {
			return nil, fmt.Errorf("zklease: %s/%s: the parent's sequence counter overflowed (2^31 nodes created); delete %s while no one holds or waits for the lease", parent, n, parent)
		}
		out = append(out, child{name: n, guid: n[:i], seq: seq})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out, nil
}

// position returns the index of the node named name in sorted children, or
// -1.
func position(children []child, name string) int {
	for i, c := range children {
		if c.name == name {
			return i
		}
	}
	return -1
}

// baseName returns the last component of a path.
func baseName(path string) string { return path[strings.LastIndexByte(path, '/')+1:] }
