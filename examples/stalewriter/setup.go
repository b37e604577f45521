package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekit/fencekit/examples/internal/demo"
	"github.com/fencekit/fencekit/internal/rig/leftover"
	"github.com/fencekit/fencekit/internal/rig/services"
)

// scenario holds what one run created: the schema and the lease's keys
// (Stores), and the object in S3.
type scenario struct {
	cfg workerConfig
	*demo.Stores
	s3         *s3.Client
	objectDone func()         // strikes the object off the run's ledger
	dropRowDB  func() error   // removes the row's MariaDB database or SQLite file (--row-store)
	keepRowDB  func()         // keeps it (--keep)
	dynamo     *demo.RunTable // the run's DynamoDB table (--dynamodb)
}

// setUp creates what the run works in: the schema with the row, the
// lease's keys, the row's database with --row-store, the DynamoDB table
// with --dynamodb; and names the object in S3.
func setUp(ctx context.Context, svc *services.Set, o options) (*scenario, error) {
	id := demo.RandomID()
	sc := &scenario{cfg: workerConfig{
		ChildLease: demo.NewChildLease(svc, o.LeaseStore, "stalewriter_"+id, "stalewriter-"+id, o.TTL),
		S3:         svc.S3, Table: "report", RowID: "2026-11",
		ObjectKey: "stalewriter/" + id + "/report.json", Resource: "report/2026-11",
		WriteDelay: o.writeDelay, Unguarded: o.unguarded, RowStore: o.rowStore,
	}}
	var err error
	stores := sc.cfg.StoresConfig(svc)
	stores.CreateTables, stores.FencedTables = sc.createTable, []string{sc.cfg.Table}
	sc.Stores, err = demo.SetUpStores(ctx, stores)
	if err != nil {
		return nil, err
	}
	if sc.cfg.rowStoreName() != rowPostgres {
		if sc.dropRowDB, sc.keepRowDB, err = sc.setUpRowDB(ctx); err != nil {
			return nil, errorsJoin(err, sc.Stores.TearDown())
		}
	}
	sc.s3 = services.NewS3Client(svc.S3)
	if o.dynamodb {
		if err := sc.setUpDynamo(ctx, id); err != nil {
			_ = sc.Stores.TearDown()
			return nil, err
		}
	}
	sc.objectDone = leftover.Track(leftover.Entry{Kind: leftover.KindS3Object, URL: svc.S3.Endpoint, Bucket: svc.S3.Bucket,
		Name: sc.cfg.ObjectKey, Access: svc.S3.AccessKey, Secret: svc.S3.SecretKey, Ephemeral: svc.S3Started})
	return sc, nil
}

// createTable creates the report table with its one row, not written yet.
func (sc *scenario) createTable(ctx context.Context, pool *pgxpool.Pool) error {
	table := pgx.Identifier{sc.cfg.Schema, sc.cfg.Table}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY, written_by text NOT NULL, token bigint NOT NULL, note text NOT NULL)`); err != nil {
		return fmt.Errorf("create table: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, '', 0, 'not written yet')`, sc.cfg.RowID); err != nil {
		return fmt.Errorf("insert row: %w", err)
	}
	return nil
}

// tearDown removes what setUp created.
func (sc *scenario) tearDown(errOut io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := sc.s3.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(sc.cfg.S3.Bucket), Key: aws.String(sc.cfg.ObjectKey)})
	if err == nil {
		sc.objectDone()
	}
	if sc.dropRowDB != nil {
		err = errors.Join(err, sc.dropRowDB())
	}
	if err := errors.Join(sc.Stores.TearDown(), err, sc.tearDownDynamo(ctx)); err != nil {
		fmt.Fprintf(errOut, "stalewriter: cleaning up: %v\n", err)
	}
}

// keep leaves what the run created in place (--keep) and says where it is.
func (sc *scenario) keep(s *demo.Session) {
	out := s.Out
	sc.Stores.Keep()
	sc.objectDone()
	fmt.Fprintf(out, "\nKept (--keep):\n  schema %s in %s\n", sc.cfg.Schema, services.Redact(sc.cfg.PostgresURL))
	if sc.Redis != nil {
		fmt.Fprintf(out, "  lease keys %s and %s in %s\n", sc.Keys.Lease, sc.Keys.Token, sc.cfg.RedisURL)
	}
	if sc.cfg.RowDSN != "" {
		sc.keepRowDB()
		fmt.Fprintf(out, "  the row in %s: %s (remove it when done)\n", sc.cfg.RowStore, sc.cfg.RowDSN)
	}
	fmt.Fprintf(out, "  object s3://%s/%s at %s\n", sc.cfg.S3.Bucket, sc.cfg.ObjectKey, sc.cfg.S3.Endpoint)
	if d := sc.cfg.Dynamo; d != nil {
		sc.dynamo.Keep()
		fmt.Fprintf(out, "  item dynamodb://%s/%s at %s\n", d.Table, d.Key, d.Endpoint)
	}
	s.PrintKeptServers()
}

// startWorker starts the worker process role (A or B) in the group
// workers: it gives up on the lease after acquireTimeout.
func (sc *scenario) startWorker(workers *demo.Group[event], role string, acquireTimeout time.Duration) (*demo.Proc, error) {
	cfg := sc.cfg
	cfg.Role, cfg.AcquireTimeout = role, acquireTimeout
	return workers.Start(role, cfg)
}
