package reliability

import (
	"fmt"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The models are sequential specifications of what each guard promises,
// written from the packages' documentation, not from their code. Each is
// a register guarded by a monotone token: a write presenting token t is
// applied only if t >= the newest token the register accepted (so accepted
// tokens never go down), a rejection names the stored token and changes
// nothing, and a read returns the last applied write. An operation whose
// outcome is unknown may have been applied at any point after its call, or
// never; one that failed plainly was not applied.
//
// They are nondeterministic models (porcupine's power-set construction)
// only because of unknown outcomes: every other step has at most one next
// state.

type opKind int

const (
	opUpdate opKind = iota
	opInsert
	opUpsert
	opDelete
	opRead
	opBegin // Guard.BeginFunc (any Beginner)
	opPut
	opPutIf
	opBlobDelete
	opGet
)

func (k opKind) String() string {
	return [...]string{"Update", "Insert", "Upsert", "Delete", "Read", "BeginFunc", "Put", "PutIf", "Delete", "Get"}[k]
}

// ---- sqlguard.Table: one row per key ----------------------------------

// rowInput is a Table write or a read of one row.
type rowInput struct {
	Key   string
	Op    opKind
	Token uint64
	Value string
	Via   string // pool, pool-proxy, tx: for reports
}

// rowState is one row: absent, or a value and its lock_version. A Delete
// takes the row's lock_version with it (sqlguard.Table.Delete documents
// this): a later Insert starts again from its own token.
type rowState struct {
	Exists  bool
	Value   string
	Version uint64
}

func rowStep(s rowState, in rowInput, out result) []any {
	t := in.Token
	newer := s.Exists && s.Version > t // the row rejects t
	var applied rowState
	canApply := false
	switch in.Op {
	case opRead:
		if out.Exists == s.Exists && (!s.Exists || out.Value == s.Value && out.Token == s.Version) {
			return []any{s}
		}
		return nil
	case opUpdate:
		canApply = s.Exists && !newer
		applied = rowState{true, in.Value, t}
	case opInsert:
		canApply = !s.Exists
		applied = rowState{true, in.Value, t}
	case opUpsert:
		canApply = !newer
		applied = rowState{true, in.Value, t}
	case opDelete:
		canApply = s.Exists && !newer
		applied = rowState{}
	}
	switch out.Outcome {
	case outOK:
		if canApply {
			return []any{applied}
		}
	case outStale:
		if newer && out.Current == s.Version {
			return []any{s}
		}
	case outNotFound:
		if !s.Exists && (in.Op == opUpdate || in.Op == opDelete) {
			return []any{s}
		}
	case outExists:
		if in.Op == opInsert && s.Exists && !newer {
			return []any{s}
		}
	case outNoChange, outFailed:
		return []any{s}
	case outUnknown:
		if canApply {
			return []any{s, applied}
		}
		return []any{s}
	}
	return nil
}

// rowModel partitions by key (rows are independent).
func rowModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionBy(func(in any) string { return in.(rowInput).Key }),
		Init:      func() []any { return []any{rowState{}} },
		Step: func(state, input, output any) []any {
			return rowStep(state.(rowState), input.(rowInput), output.(result))
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(rowInput), output.(result)
			if in.Op == opRead {
				if !out.Exists {
					return fmt.Sprintf("Read(%s) -> absent", in.Key)
				}
				return fmt.Sprintf("Read(%s) -> %q v%d", in.Key, out.Value, out.Token)
			}
			return fmt.Sprintf("%s(%s, t%d, %q) via %s -> %s", in.Op, in.Key, in.Token, in.Value, in.Via, describeOut(out))
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%+v", state) },
	}
	return nm.ToModel()
}

// ---- sqlguard.Guard: one resource, its token and the data it fences ----

// guardInput is a fenced transaction that sets the resource's data to
// Value with Token, or a read of both.
type guardInput struct {
	Resource string
	Op       opKind // opBegin or opRead
	Token    uint64
	Value    string
	Via      string // pool, conn, savepoint
}

// guardState is the resource's newest token (0: none yet) and its data.
type guardState struct {
	Token uint64
	Value string
}

func guardStep(s guardState, in guardInput, out result) []any {
	if in.Op == opRead {
		if out.Token == s.Token && out.Value == s.Value {
			return []any{s}
		}
		return nil
	}
	canApply := in.Token >= s.Token
	applied := guardState{in.Token, in.Value}
	switch out.Outcome {
	case outOK:
		if canApply {
			return []any{applied}
		}
	case outStale:
		if !canApply && out.Current == s.Token {
			return []any{s}
		}
	case outNoChange, outFailed:
		return []any{s}
	case outUnknown:
		if canApply {
			return []any{s, applied}
		}
		return []any{s}
	}
	return nil
}

func guardModel(initial string) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partitionBy(func(in any) string { return in.(guardInput).Resource }),
		Init:      func() []any { return []any{guardState{Value: initial}} },
		Step: func(state, input, output any) []any {
			return guardStep(state.(guardState), input.(guardInput), output.(result))
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(guardInput), output.(result)
			if in.Op == opRead {
				return fmt.Sprintf("Read(%s) -> t%d %q", in.Resource, out.Token, out.Value)
			}
			return fmt.Sprintf("BeginFunc(%s, t%d, %q) via %s -> %s", in.Resource, in.Token, in.Value, in.Via, describeOut(out))
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%+v", state) },
	}
	return nm.ToModel()
}

// ---- blobguard.Guard: one object per key -------------------------------

// blobInput is a Put, PutIf, Delete or Get of one key. PutIf carries the
// ETag of the Version it is conditional on ("" for the zero Version: no
// live object).
type blobInput struct {
	Key      string
	Op       opKind
	Token    uint64
	Body     string
	PrevETag string
	Via      string
}

// blobState is the object at a key: absent, live or a tombstone, with the
// token and body of the write that made it and that write's ETag. An ETag
// of "" means the write's outcome was unknown to its caller, so its ETag
// was never returned: the first read that meets the write binds it. Every
// write has an ETag of its own (the guard's nonce makes each one unique),
// so Bound lists the ETags already bound on this path, which no other
// write can have.
type blobState struct {
	Exists  bool
	Deleted bool
	Token   uint64
	Body    string
	ETag    string
	Bound   string // ETags bound to writes of unknown outcome so far, each followed by ","
}

// blobSpec holds what the blob model needs to know about the whole
// history: the ETags returned to callers of writes that were acknowledged.
// An unbound state may only be bound to an ETag that is none of those, and
// none bound before.
type blobSpec struct{ known map[string]bool }

func (b blobSpec) etagMatches(s blobState, etag string) (blobState, bool) {
	etag = normETag(etag)
	if s.ETag == "" {
		if b.known[etag] || strings.Contains(s.Bound, etag+",") {
			return s, false
		}
		s.ETag = etag
		s.Bound += etag + ","
		return s, true
	}
	return s, s.ETag == etag
}

func (b blobSpec) step(s blobState, in blobInput, out result) []any {
	t := in.Token
	newer := s.Exists && s.Token > t
	if in.Op == opGet {
		switch {
		case out.Outcome == outNotFound && !s.Exists && out.ETag == "":
			return []any{s}
		case out.Outcome == outNotFound && s.Exists && s.Deleted && out.ETag != "" && out.Token == s.Token:
			if ns, ok := b.etagMatches(s, out.ETag); ok {
				return []any{ns}
			}
		case out.Outcome == outRead && s.Exists && !s.Deleted && out.Value == s.Body && out.Token == s.Token:
			if ns, ok := b.etagMatches(s, out.ETag); ok {
				return []any{ns}
			}
		case out.Outcome == outFailed:
			return []any{s}
		}
		return nil
	}
	canApply := !newer
	if in.Op == opPutIf {
		// The write happens only on the version it was conditional on.
		matches := false
		var bound blobState
		if in.PrevETag == "" {
			matches, bound = !s.Exists || s.Deleted, s
		} else if s.Exists {
			bound, matches = b.etagMatches(s, in.PrevETag)
		}
		if matches {
			s = bound
		}
		canApply = canApply && matches
		if out.Outcome == outConflict {
			if !matches && !newer {
				return []any{s}
			}
			return nil
		}
	}
	applied := blobState{Exists: true, Deleted: in.Op == opBlobDelete, Token: t, Body: in.Body, Bound: s.Bound}
	switch out.Outcome {
	case outOK:
		if canApply && out.Token == t {
			applied.ETag = normETag(out.ETag)
			return []any{applied}
		}
	case outStale:
		if newer && out.Current == s.Token {
			return []any{s}
		}
	case outNoChange, outFailed:
		return []any{s}
	case outUnknown:
		if canApply {
			return []any{s, applied}
		}
		return []any{s}
	}
	return nil
}

func blobModel(known map[string]bool) porcupine.Model {
	spec := blobSpec{known: known}
	nm := porcupine.NondeterministicModel{
		Partition: partitionBy(func(in any) string { return in.(blobInput).Key }),
		Init:      func() []any { return []any{blobState{}} },
		Step: func(state, input, output any) []any {
			return spec.step(state.(blobState), input.(blobInput), output.(result))
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(blobInput), output.(result)
			switch in.Op {
			case opGet:
				return fmt.Sprintf("Get(%s) via %s -> %s %q t%d %s", in.Key, in.Via, out.Outcome, out.Value, out.Token, out.ETag)
			case opPutIf:
				return fmt.Sprintf("PutIf(%s, t%d, %q, prev %q) via %s -> %s %s", in.Key, in.Token, in.Body, in.PrevETag, in.Via, describeOut(out), out.ETag)
			}
			return fmt.Sprintf("%s(%s, t%d, %q) via %s -> %s %s", in.Op, in.Key, in.Token, in.Body, in.Via, describeOut(out), out.ETag)
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%+v", state) },
	}
	return nm.ToModel()
}

// normETag strips an ETag's quotes: stores and SDKs differ in whether they
// keep them.
func normETag(e string) string { return strings.ToLower(strings.Trim(e, `"`)) }

func describeOut(out result) string {
	switch out.Outcome {
	case outStale:
		return fmt.Sprintf("stale (current %d)", out.Current)
	case outFailed, outUnknown, outNoChange:
		msg := out.Err
		if len(msg) > 120 {
			msg = msg[:120] + "..."
		}
		return out.Outcome.String() + ": " + msg
	}
	return out.Outcome.String()
}

// partitionBy splits a history into independent parts by key.
func partitionBy(key func(in any) string) func([]porcupine.Operation) [][]porcupine.Operation {
	return func(ops []porcupine.Operation) [][]porcupine.Operation {
		idx := map[string]int{}
		var parts [][]porcupine.Operation
		for _, op := range ops {
			k := key(op.Input)
			i, ok := idx[k]
			if !ok {
				i = len(parts)
				idx[k] = i
				parts = append(parts, nil)
			}
			parts[i] = append(parts[i], op)
		}
		return parts
	}
}
