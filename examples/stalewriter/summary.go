package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// summary is what --json writes.
type summary struct {
	OK           bool        `json:"ok"`
	Inconclusive bool        `json:"inconclusive"`
	Verdict      string      `json:"verdict"`
	Unguarded    bool        `json:"unguarded"`
	TTLMillis    int64       `json:"ttl_ms"`
	PauseMillis  int64       `json:"pause_ms"`
	TokenA       fence.Token `json:"token_a"`
	TokenB       fence.Token `json:"token_b"`
	Writes       []event     `json:"writes"`
	Final        finalState  `json:"final"`
	Services     []string    `json:"services"`
	// KeptDirs are the data directories of the servers the demo started,
	// left in place with --keep.
	KeptDirs []string      `json:"kept_dirs,omitempty"`
	Run      runInfo       `json:"run"`
	Events   []event       `json:"events"`
	Elapsed  time.Duration `json:"elapsed_ns"`
}

// runInfo names what the run created (kept with --keep).
type runInfo struct {
	Schema      string `json:"schema"`
	Table       string `json:"table"`
	RowID       string `json:"row_id"`
	Bucket      string `json:"bucket"`
	ObjectKey   string `json:"object_key"`
	LeaseName   string `json:"lease_name"`
	LeaseStore  string `json:"lease_store"`
	RedisPrefix string `json:"redis_prefix"`
	// RowStore and RowDSN say where the row lives with --row-store
	// mariadb or sqlite (a database/sql DSN).
	RowStore string `json:"row_store,omitempty"`
	RowDSN   string `json:"row_dsn,omitempty"`
}

type finalState struct {
	RowWrittenBy   string      `json:"row_written_by"`
	RowToken       fence.Token `json:"row_token"`
	RowLockVersion int64       `json:"row_lock_version"`
	// RowStore is where the row lives: "" (postgres), mariadb or sqlite.
	RowStore        string      `json:"row_store,omitempty"`
	ObjectWrittenBy string      `json:"object_written_by"`
	ObjectToken     fence.Token `json:"object_token"`
	// Item is set with --dynamodb: ItemWrittenBy and ItemToken then say
	// who wrote the DynamoDB item last, with which token.
	Item          bool        `json:"item,omitempty"`
	ItemWrittenBy string      `json:"item_written_by,omitempty"`
	ItemToken     fence.Token `json:"item_token,omitempty"`
}

// newSummary starts the summary of a run of sc with the options o.
func (sc *scenario) newSummary(o options) *summary {
	return &summary{Unguarded: o.unguarded, TTLMillis: o.TTL.Milliseconds(), PauseMillis: o.pause.Milliseconds(),
		Run: runInfo{Schema: sc.cfg.Schema, Table: sc.cfg.Table, RowID: sc.cfg.RowID, Bucket: sc.cfg.S3.Bucket,
			ObjectKey: sc.cfg.ObjectKey, LeaseName: sc.cfg.LeaseName, LeaseStore: sc.cfg.LeaseStore, RedisPrefix: sc.cfg.RedisPrefix,
			RowStore: sc.cfg.RowStore, RowDSN: sc.cfg.RowDSN}}
}

// conclude reads what the stores kept and judges the run's events by it.
func (sc *scenario) conclude(ctx context.Context, sum *summary, unguarded bool) error {
	if err := sc.readFinal(ctx, &sum.Final, unguarded); err != nil {
		return fmt.Errorf("reading the final state: %w", err)
	}
	if err := sc.readFinalItem(ctx, &sum.Final); err != nil {
		return fmt.Errorf("reading the final state: %w", err)
	}
	for _, e := range sum.Events {
		if e.Kind == evWrite {
			sum.Writes = append(sum.Writes, e)
		}
	}
	v := judge(sum.Events, sum.Final, unguarded)
	sum.OK, sum.Inconclusive, sum.Verdict = v.OK, v.Inconclusive, v.String()
	return nil
}

// printFinal prints what the stores kept and the verdict.
func (sum *summary) printFinal(out io.Writer) {
	fmt.Fprintf(out, "\nFinal state:\n  row:    written by %s, token %d, lock_version %d\n  object: written by %s, token %d\n%s\n%s\n",
		orNone(sum.Final.RowWrittenBy), sum.Final.RowToken, sum.Final.RowLockVersion,
		orNone(sum.Final.ObjectWrittenBy), sum.Final.ObjectToken, itemLine(sum.Final), sum.Verdict)
}

// exitCode is the program's exit status for the run: 0 safe, 1 unsafe, 2
// not shown.
func (sum *summary) exitCode() int {
	switch {
	case sum.Inconclusive:
		return 2
	case !sum.OK:
		return 1
	}
	return 0
}

func orNone(s string) string {
	if s == "" {
		return "(nobody)"
	}
	return s
}

// readFinal reads who wrote the row and the object last, with which token.
func (sc *scenario) readFinal(ctx context.Context, f *finalState, unguarded bool) error {
	if sc.cfg.rowStoreName() != rowPostgres {
		if err := sc.readFinalDB(ctx, f); err != nil {
			return err
		}
	} else {
		table := pgx.Identifier{sc.cfg.Schema, sc.cfg.Table}.Sanitize()
		var tok int64
		if err := sc.Pool.QueryRow(ctx, `SELECT written_by, token, lock_version FROM `+table+` WHERE id = $1`, sc.cfg.RowID).
			Scan(&f.RowWrittenBy, &tok, &f.RowLockVersion); err != nil {
			return err
		}
		f.RowToken = fence.Token(tok)
	}
	var body []byte
	if unguarded {
		res, err := sc.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(sc.cfg.S3.Bucket), Key: aws.String(sc.cfg.ObjectKey)})
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if body, err = io.ReadAll(res.Body); err != nil {
			return err
		}
	} else {
		g, err := blobguard.New(sc.s3, sc.cfg.S3.Bucket)
		if err != nil {
			return err
		}
		obj, err := g.Get(ctx, sc.cfg.ObjectKey)
		if err != nil {
			return err
		}
		body = obj.Body
		if obj.Token() != fence.Token(0) {
			f.ObjectToken = obj.Token()
		}
	}
	var ob objectBody
	if err := json.Unmarshal(body, &ob); err != nil {
		return fmt.Errorf("object body %q: %w", body, err)
	}
	f.ObjectWrittenBy = ob.WrittenBy
	if f.ObjectToken == 0 {
		f.ObjectToken = ob.Token
	}
	return nil
}
