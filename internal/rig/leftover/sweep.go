package leftover

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dynamotypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
)

// maxAge is how long the sweep keeps retrying an entry it cannot remove (a
// server that no longer answers) before it forgets it.
const maxAge = 7 * 24 * time.Hour

// Sweep removes what earlier runs left behind: for every ledger whose run is
// no longer alive, it kills the run's processes that still run (SIGKILL,
// after SIGCONT for a stopped one), removes its temporary directories,
// drops its schemas and MariaDB databases, deletes its Redis keys, S3
// objects and DynamoDB tables, and removes the ledger. An entry it cannot remove (a server that does not answer)
// stays in the ledger for the next sweep, for up to seven days; an entry
// in a server the run had started itself is dropped when that server no
// longer answers (it is gone, and so is what it held). Ledgers of runs
// still alive are left alone. logf receives one line per thing swept.
// ctx bounds the sweep; each removal also has its own 5-second limit.
func Sweep(ctx context.Context, logf func(string, ...any)) {
	dir, err := Dir()
	if err != nil {
		return
	}
	paths, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var f ledgerFile
		if err := json.Unmarshal(b, &f); err != nil {
			logf("removing unreadable ledger %s: %v", path, err)
			_ = os.Remove(path)
			continue
		}
		if f.Pid == os.Getpid() || Alive(f.Pid, f.Start) {
			continue // this run, or another one still running
		}
		logf("cleaning up after an earlier %s run (pid %d, %s) that did not finish:", f.Program, f.Pid, f.Created.Local().Format(time.DateTime))
		var kept []Entry
		// Processes first, so that their directories are free to go.
		for _, pass := range []bool{true, false} {
			for _, e := range f.Entries {
				if (e.Kind == KindProcess) != pass {
					continue
				}
				switch did, err := sweepEntry(ctx, e); {
				case err != nil:
					logf("  could not remove %s: %v", e, err)
					kept = append(kept, e)
				case did != "":
					logf("  %s %s", did, e)
				}
			}
		}
		if len(kept) == 0 || time.Since(f.Created) > maxAge {
			_ = os.Remove(path)
			continue
		}
		f.Entries = kept
		if b, err := json.MarshalIndent(f, "", "  "); err == nil {
			_ = os.WriteFile(path, b, 0o600)
		}
	}
}

// sweepEntry removes e and says what it did ("" when there was nothing
// left to do).
func sweepEntry(ctx context.Context, e Entry) (did string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	switch e.Kind {
	case KindProcess:
		if !Alive(e.Pid, e.Start) {
			return "", nil
		}
		return "killed", killProcess(ctx, e.Pid, e.Start)
	case KindDir:
		if !safeDir(e.Path) {
			return "", fmt.Errorf("%w: %s", ErrUnsafePath, e.Path)
		}
		if _, err := os.Lstat(e.Path); errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "removed", os.RemoveAll(e.Path)
	case KindSchema:
		if !schemaName.MatchString(e.Name) {
			return "", fmt.Errorf("leftover: refusing to drop schema %q: not a name the example programs use", e.Name)
		}
		return removed(e, dropSchema(ctx, e.URL, e.Name))
	case KindRedisKeys:
		return removed(e, deleteKeys(ctx, e.URL, e.Keys))
	case KindS3Object:
		return removed(e, deleteObject(ctx, e))
	case KindDynamoTable:
		if !dynamoTableName.MatchString(e.Name) {
			return "", fmt.Errorf("leftover: refusing to delete DynamoDB table %q: not a name the example programs use", e.Name)
		}
		return deleteTable(ctx, e)
	case KindMySQLDatabase:
		if !mysqlDatabaseName.MatchString(e.Name) {
			return "", fmt.Errorf("leftover: refusing to drop MariaDB database %q: not a name the example programs use", e.Name)
		}
		return removed(e, dropMySQLDatabase(ctx, e.URL, e.Name))
	}
	return "", fmt.Errorf("leftover: unknown entry kind %q", e.Kind)
}

// removed is sweepEntry's answer for an entry in a server: "removed", or
// nothing to do when the server was one the run had started itself and
// no longer answers (it is gone, and what it held with it), or err.
func removed(e Entry, err error) (string, error) {
	if err == nil {
		return "removed", nil
	}
	var pgErr *pgconn.PgError
	if e.Ephemeral && !errors.As(err, &pgErr) {
		return "", nil
	}
	return "", err
}

// killProcess kills pid if it still runs and is the process that started at
// start, and waits until it is gone.
func killProcess(ctx context.Context, pid int, start uint64) error {
	if !Alive(pid, start) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGCONT)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	for Alive(pid, start) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("process %d still runs after SIGKILL", pid)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

func dropSchema(ctx context.Context, url, schema string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	return err
}

// dropMySQLDatabase drops the database name (checked by the caller: no
// quoting is needed) on the server of the go-sql-driver DSN dsn.
func dropMySQLDatabase(ctx context.Context, dsn, name string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name)
	return err
}

func deleteKeys(ctx context.Context, url string, keys []string) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	defer c.Close()
	return c.Del(ctx, keys...).Err()
}

// deleteTable deletes the DynamoDB table e names; a table that is no longer
// there (DynamoDB Local runs in memory and forgets its tables when it
// stops) leaves nothing to do.
func deleteTable(ctx context.Context, e Entry) (string, error) {
	c := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(e.URL),
		// DynamoDB Local takes any credentials; the programs use these.
		Credentials: credentials.NewStaticCredentialsProvider("fencekit", "fencekit", ""),
	})
	_, err := c.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(e.Name)})
	var nf *dynamotypes.ResourceNotFoundException
	switch {
	case errors.As(err, &nf):
		return "", nil
	case err != nil:
		return "", err
	}
	return "removed", nil
}

func deleteObject(ctx context.Context, e Entry) error {
	c := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(e.URL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(e.Access, e.Secret, ""),
	})
	_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(e.Bucket), Key: aws.String(e.Name)})
	return err
}
