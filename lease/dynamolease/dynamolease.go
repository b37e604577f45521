package dynamolease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/lease/driver"
)

// Client is the part of *dynamodb.Client the backend uses: only the
// operations it calls. *dynamodb.Client satisfies it, and so can a wrapper
// that injects faults or counts calls.
type Client interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
}

var (
	_ Client           = (*dynamodb.Client)(nil)
	_ driver.Backend   = (*Backend)(nil)
	_ driver.Checker   = (*Backend)(nil)
	_ driver.Inspector = (*Backend)(nil)
)

// ErrInvalidInput is returned by New for a nil client, an empty table name
// or invalid options (every problem at once).
var ErrInvalidInput = errors.New("dynamolease: invalid input")

// Attribute names of a lease item (besides the key, Options.KeyAttribute).
// Every one is a reserved word or may become one, so the backend always
// names them through ExpressionAttributeNames.
const (
	attrToken = "token"  // N: the last token granted for the name; never removed
	attrOwner = "owner"  // S: the current grant's owner; absent when free
	attrRVN   = "rvn"    // S: record version, new on every grant, renew and end
	attrTTL   = "ttl_ms" // N: the current grant's TTL in milliseconds
	// endedPrefix + owner: M {how S, at N, keep N}: an owner ended by
	// Release or Abandon (or whose Release found it lost), how, when (Unix
	// milliseconds, the writer's clock) and for how long it must be kept
	// (milliseconds).
	endedPrefix = "ended:"
)

// How an ended owner ended.
const (
	howReleased  = "released"
	howAbandoned = "abandoned"
	howLost      = "lost"
)

// Options configure a Backend; set them with Option values passed to New.
type Options struct {
	// KeyAttribute is the table's partition key, a string. Default "name".
	KeyAttribute string
	// KeyPrefix is put in front of every lease name to make its key, so
	// that several namespaces can share one table. Default "".
	KeyPrefix string
	// PruneAfter is how long past driver.EndedOwnerTTL an ended owner's
	// record is kept before a later Acquire removes it, to allow for
	// clocks that disagree (the record's time is the writer's wall clock,
	// the pruner compares with its own). Default 1 minute.
	PruneAfter time.Duration
}

// Option changes Options.
type Option func(*Options)

// WithKeyAttribute sets Options.KeyAttribute.
func WithKeyAttribute(name string) Option { return func(o *Options) { o.KeyAttribute = name } }

// WithKeyPrefix sets Options.KeyPrefix.
func WithKeyPrefix(prefix string) Option { return func(o *Options) { o.KeyPrefix = prefix } }

// WithPruneAfter sets Options.PruneAfter (0: the default; below 0 is refused).
func WithPruneAfter(d time.Duration) Option { return func(o *Options) { o.PruneAfter = d } }

// Defaults of Options.
const (
	DefaultKeyAttribute = "name"
	DefaultPruneAfter   = time.Minute
)

// maxPrune bounds the ended owners one Acquire removes.
const maxPrune = 32

// maxSeen bounds the observations a Backend keeps (see Backend).
const maxSeen = 4096

// Backend is a driver.Backend over one DynamoDB table. It is safe for
// concurrent use; several Managers may share it. Create it with New.
type Backend struct {
	client Client
	table  string
	opts   Options

	mu    sync.Mutex
	seen  map[string]observation // per key: the record version first seen, and when
	prune map[string][]string    // per key: ended-owner attributes old enough to remove
}

// observation is a record version of a held lease as this backend first
// saw it: at is read (monotonic) after the reply that showed it arrived,
// so it is later than the moment the holder's request that wrote it was
// sent.
type observation struct {
	rvn string
	at  time.Time
	ttl time.Duration
}

// New returns a Backend for table over client. It does no I/O; call Check
// (or Manager.Check) to learn whether the table exists with the right key.
func New(client Client, table string, opts ...Option) (*Backend, error) {
	var o Options
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	var errs []error
	if client == nil {
		errs = append(errs, fmt.Errorf("%w: nil client", ErrInvalidInput))
	} else if c, ok := client.(*dynamodb.Client); ok && c == nil {
		errs = append(errs, fmt.Errorf("%w: nil client", ErrInvalidInput))
	}
	if table == "" {
		errs = append(errs, fmt.Errorf("%w: empty table name", ErrInvalidInput))
	}
	if o.PruneAfter < 0 {
		errs = append(errs, fmt.Errorf("%w: PruneAfter %v < 0", ErrInvalidInput, o.PruneAfter))
	}
	if o.KeyAttribute == "" {
		o.KeyAttribute = DefaultKeyAttribute
	}
	switch {
	case o.KeyAttribute == attrToken || o.KeyAttribute == attrOwner || o.KeyAttribute == attrRVN || o.KeyAttribute == attrTTL,
		strings.HasPrefix(o.KeyAttribute, endedPrefix):
		errs = append(errs, fmt.Errorf("%w: KeyAttribute %q is one of the backend's own attributes", ErrInvalidInput, o.KeyAttribute))
	}
	if o.PruneAfter == 0 {
		o.PruneAfter = DefaultPruneAfter
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Backend{client: client, table: table, opts: o, seen: map[string]observation{}, prune: map[string][]string{}}, nil
}

// Options returns the options the Backend runs with, defaults filled in.
func (b *Backend) Options() Options { return b.opts }

// Limits: TTLs in whole milliseconds, no maximum. The store does not keep
// time (see the package documentation), so it does not round TTLs.
func (b *Backend) Limits() driver.Limits {
	return driver.Limits{MinTTL: time.Millisecond, Resolution: time.Millisecond}
}

func (b *Backend) key(name string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{b.opts.KeyAttribute: &types.AttributeValueMemberS{Value: b.opts.KeyPrefix + name}}
}

func str(s string) *types.AttributeValueMemberS { return &types.AttributeValueMemberS{Value: s} }

func num[T int64 | uint64](n T) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: fmt.Sprint(n)}
}

func newRVN() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("dynamolease: record version: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// endedRecord is the value of an ended owner's attribute.
func endedRecord(how string, ttl time.Duration) *types.AttributeValueMemberM {
	return &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		"how":  str(how),
		"at":   num(time.Now().UnixMilli()),
		"keep": num(driver.EndedOwnerTTL(ttl).Milliseconds()),
	}}
}

// Acquire grants req.Name to req.Owner with one UpdateItem that sets the
// owner, a new record version and the TTL, and mints the token in the same
// request (token = if_not_exists(token, floor) + 1, where floor is this
// host's clock in microseconds, used only when the item has no token: a
// new name, or a table that lost its data). Its condition: req.Owner was
// not ended, and the lease is free, or its record version is one this
// backend saw unchanged for the whole TTL it carried, measured on this
// host's monotonic clock from the reply that first showed it.
//
// When the condition fails it reads the item from the same request
// (ReturnValuesOnConditionCheckFailure=ALL_OLD): an ended owner is refused
// with ErrNotAcquired; req.Owner holding the grant already (a retried
// request) extends it with a second request (as Renew) and returns the
// same token; another holder gives a *driver.NotAcquiredError whose
// RetryAfter is how much of the TTL this backend still has to see its
// record version unchanged. A missing table gives a *driver.SetupError.
func (b *Backend) Acquire(ctx context.Context, req driver.Request) (driver.Grant, error) {
	key := b.opts.KeyPrefix + req.Name
	rvn, err := newRVN()
	if err != nil {
		return driver.Grant{}, err
	}
	names := map[string]string{"#tok": attrToken, "#own": attrOwner, "#rvn": attrRVN, "#ttl": attrTTL, "#me": endedPrefix + req.Owner}
	values := map[string]types.AttributeValue{
		":me": str(req.Owner), ":rvn": str(rvn), ":ttl": num(req.TTL.Milliseconds()),
		":floor": num(uint64(time.Now().UnixMicro())), ":one": num(int64(1)),
	}
	cond := "attribute_not_exists(#me) AND (attribute_not_exists(#own)"
	b.mu.Lock()
	obs, ok := b.seen[key]
	pruned := b.prune[key]
	b.mu.Unlock()
	if ok && time.Since(obs.at) >= obs.ttl {
		cond += " OR #rvn = :seen"
		values[":seen"] = str(obs.rvn)
	}
	cond += ")"
	update := "SET #own = :me, #rvn = :rvn, #ttl = :ttl, #tok = if_not_exists(#tok, :floor) + :one"
	if len(pruned) > 0 {
		var rm []string
		for i, a := range pruned {
			if a == endedPrefix+req.Owner {
				continue
			}
			ph := "#p" + strconv.Itoa(i)
			names[ph] = a
			rm = append(rm, ph)
		}
		if len(rm) > 0 {
			update += " REMOVE " + strings.Join(rm, ", ")
		}
	}
	out, err := b.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(b.table),
		Key:                                 b.key(req.Name),
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		tok, err := tokenOf(out.Attributes)
		if err != nil {
			return driver.Grant{}, fmt.Errorf("dynamolease: acquire %q: %w", req.Name, err)
		}
		b.observed(key, out.Attributes, false)
		return driver.Grant{Name: req.Name, Owner: req.Owner, Token: tok, TTL: req.TTL}, nil
	}
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return driver.Grant{}, b.storeError("acquire", req.Name, err)
	}
	old := ccf.Item
	if old == nil {
		return driver.Grant{}, fmt.Errorf("dynamolease: acquire %q: the condition failed and the server returned no item (ReturnValuesOnConditionCheckFailure is not honoured)", req.Name)
	}
	if rec, ok := old[endedPrefix+req.Owner].(*types.AttributeValueMemberM); ok {
		return driver.Grant{}, fmt.Errorf("%w: %q: owner %q was ended at the store (%s)", driver.ErrNotAcquired, req.Name, req.Owner, howOf(rec))
	}
	b.observed(key, old, true)
	if owner, _ := old[attrOwner].(*types.AttributeValueMemberS); owner != nil && owner.Value == req.Owner {
		// A retried request: the first one granted it.
		tok, err := tokenOf(old)
		if err != nil {
			return driver.Grant{}, fmt.Errorf("dynamolease: acquire %q: %w", req.Name, err)
		}
		g := driver.Grant{Name: req.Name, Owner: req.Owner, Token: tok, TTL: req.TTL}
		if err := b.Renew(ctx, g); err != nil {
			if errors.Is(err, driver.ErrNotHeld) {
				return driver.Grant{}, fmt.Errorf("%w: %q: the grant to %q ended while it was extended", driver.ErrNotAcquired, req.Name, req.Owner)
			}
			return driver.Grant{}, err
		}
		return g, nil
	}
	b.mu.Lock()
	obs = b.seen[key]
	b.mu.Unlock()
	return driver.Grant{}, &driver.NotAcquiredError{Name: req.Name, RetryAfter: max(0, obs.ttl-time.Since(obs.at))}
}

// observed records what a reply showed of key's item: its record version
// (when held by another owner and not seen before) and the ended owners
// old enough to prune.
func (b *Backend) observed(key string, item map[string]types.AttributeValue, held bool) {
	var stale []string
	now := time.Now().UnixMilli()
	for a, v := range item {
		if !strings.HasPrefix(a, endedPrefix) || len(stale) >= maxPrune {
			continue
		}
		if at, keep, ok := endedTimes(v); ok && now-at > keep+b.opts.PruneAfter.Milliseconds() {
			stale = append(stale, a)
		}
	}
	slices.Sort(stale)
	rvn, _ := item[attrRVN].(*types.AttributeValueMemberS)
	ttl, _ := item[attrTTL].(*types.AttributeValueMemberN)
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(stale) > 0 {
		b.prune[key] = stale
	} else {
		delete(b.prune, key)
	}
	if !held || rvn == nil || ttl == nil {
		delete(b.seen, key)
		return
	}
	if prev, ok := b.seen[key]; ok && prev.rvn == rvn.Value {
		return // still the version we are waiting out
	}
	ms, err := strconv.ParseInt(ttl.Value, 10, 64)
	if err != nil || ms < 0 {
		return
	}
	if len(b.seen) >= maxSeen {
		// Forgetting only delays a takeover; it never allows one early.
		clear(b.seen)
	}
	b.seen[key] = observation{rvn: rvn.Value, at: time.Now(), ttl: time.Duration(ms) * time.Millisecond}
}

func endedTimes(v types.AttributeValue) (at, keep int64, ok bool) {
	m, isMap := v.(*types.AttributeValueMemberM)
	if !isMap {
		return 0, 0, false
	}
	a, ok1 := m.Value["at"].(*types.AttributeValueMemberN)
	k, ok2 := m.Value["keep"].(*types.AttributeValueMemberN)
	if !ok1 || !ok2 {
		return 0, 0, false
	}
	at, err1 := strconv.ParseInt(a.Value, 10, 64)
	keep, err2 := strconv.ParseInt(k.Value, 10, 64)
	return at, keep, err1 == nil && err2 == nil
}

func howOf(rec *types.AttributeValueMemberM) string {
	if h, ok := rec.Value["how"].(*types.AttributeValueMemberS); ok {
		return h.Value
	}
	return ""
}

func tokenOf(item map[string]types.AttributeValue) (fence.Token, error) {
	n, ok := item[attrToken].(*types.AttributeValueMemberN)
	if !ok {
		return fence.None, fmt.Errorf("the item has no token")
	}
	v, err := strconv.ParseUint(n.Value, 10, 64)
	if err != nil || v == 0 {
		return fence.None, fmt.Errorf("the item's token %q is not a token", n.Value)
	}
	return fence.Token(v), nil
}

// Renew extends g with one UpdateItem that writes a new record version and
// the TTL, conditional on the item naming g.Owner with g.Token. A waiter
// that saw the old record version starts its wait again. It returns an
// error matching driver.ErrNotHeld when the condition fails.
func (b *Backend) Renew(ctx context.Context, g driver.Grant) error {
	rvn, err := newRVN()
	if err != nil {
		return err
	}
	_, err = b.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(b.table),
		Key:                      b.key(g.Name),
		UpdateExpression:         aws.String("SET #rvn = :rvn, #ttl = :ttl"),
		ConditionExpression:      aws.String("#own = :me AND #tok = :tok"),
		ExpressionAttributeNames: map[string]string{"#rvn": attrRVN, "#ttl": attrTTL, "#own": attrOwner, "#tok": attrToken},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":rvn": str(rvn), ":ttl": num(g.TTL.Milliseconds()), ":me": str(g.Owner), ":tok": num(uint64(g.Token)),
		},
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return fmt.Errorf("%w: %q: owner %q with token %d", driver.ErrNotHeld, g.Name, g.Owner, g.Token)
	}
	if err != nil {
		return b.storeError("renew", g.Name, err)
	}
	return nil
}

// Release ends g with one UpdateItem that removes the owner, writes a new
// record version and records g.Owner as released, conditional on the item
// naming g.Owner with g.Token. The token stays: the item is never deleted.
// When the condition fails, the item from the same request tells: an
// owner already recorded as released or abandoned gets nil (a resent
// Release), one recorded as lost gets driver.ErrNotHeld; otherwise the
// grant was lost, and a second request records the owner as lost before
// driver.ErrNotHeld is returned.
func (b *Backend) Release(ctx context.Context, g driver.Grant) error {
	rvn, err := newRVN()
	if err != nil {
		return err
	}
	me := endedPrefix + g.Owner
	_, err = b.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(b.table),
		Key:                      b.key(g.Name),
		UpdateExpression:         aws.String("SET #rvn = :rvn, #me = :rec REMOVE #own"),
		ConditionExpression:      aws.String("#own = :me AND #tok = :tok"),
		ExpressionAttributeNames: map[string]string{"#rvn": attrRVN, "#me": me, "#own": attrOwner, "#tok": attrToken},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":rvn": str(rvn), ":rec": endedRecord(howReleased, g.TTL), ":me": str(g.Owner), ":tok": num(uint64(g.Token)),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return b.storeError("release", g.Name, err)
	}
	if err == nil {
		return nil
	}
	if rec, ok := ccf.Item[me].(*types.AttributeValueMemberM); ok {
		if howOf(rec) == howLost {
			return fmt.Errorf("%w: %q: owner %q had lost it", driver.ErrNotHeld, g.Name, g.Owner)
		}
		return nil // released (or abandoned) before: a resent Release
	}
	if err := b.recordEnded(ctx, g.Name, g.Owner, howLost, g.TTL); err != nil {
		return errors.Join(fmt.Errorf("%w: %q: owner %q with token %d", driver.ErrNotHeld, g.Name, g.Owner, g.Token), err)
	}
	return fmt.Errorf("%w: %q: owner %q with token %d", driver.ErrNotHeld, g.Name, g.Owner, g.Token)
}

// recordEnded records owner as ended (how) unless it is recorded already
// or holds the name (then Abandon's first request ends it).
func (b *Backend) recordEnded(ctx context.Context, name, owner, how string, ttl time.Duration) error {
	_, err := b.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(b.table),
		Key:                       b.key(name),
		UpdateExpression:          aws.String("SET #me = if_not_exists(#me, :rec)"),
		ConditionExpression:       aws.String("attribute_not_exists(#own) OR #own <> :me"),
		ExpressionAttributeNames:  map[string]string{"#me": endedPrefix + owner, "#own": attrOwner},
		ExpressionAttributeValues: map[string]types.AttributeValue{":rec": endedRecord(how, ttl), ":me": str(owner)},
	})
	if err != nil {
		return b.storeError("record ended owner of", name, err)
	}
	return nil
}

// Abandon ends whatever grant req.Owner holds of req.Name (one UpdateItem
// conditional on the item naming req.Owner, which removes it and records
// it as abandoned) and, if it held none, records it as abandoned with a
// second request conditional on its not holding the name (tried again if
// it came to hold it in between).
func (b *Backend) Abandon(ctx context.Context, req driver.Request) error {
	me := endedPrefix + req.Owner
	for range 5 {
		rvn, err := newRVN()
		if err != nil {
			return err
		}
		_, err = b.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(b.table),
			Key:                       b.key(req.Name),
			UpdateExpression:          aws.String("SET #rvn = :rvn, #me = if_not_exists(#me, :rec) REMOVE #own"),
			ConditionExpression:       aws.String("#own = :me"),
			ExpressionAttributeNames:  map[string]string{"#rvn": attrRVN, "#me": me, "#own": attrOwner},
			ExpressionAttributeValues: map[string]types.AttributeValue{":rvn": str(rvn), ":rec": endedRecord(howAbandoned, req.TTL), ":me": str(req.Owner)},
		})
		var ccf *types.ConditionalCheckFailedException
		if err == nil {
			return nil
		}
		if !errors.As(err, &ccf) {
			return b.storeError("abandon", req.Name, err)
		}
		err = b.recordEnded(ctx, req.Name, req.Owner, howAbandoned, req.TTL)
		if !errors.As(err, &ccf) {
			return err
		}
		// It came to hold the name in between: end that grant.
	}
	return fmt.Errorf("dynamolease: abandon %q: owner %q kept being granted the name", req.Name, req.Owner)
}

// Holder returns the current grant of name as the table records it (a
// strongly consistent GetItem), or driver.ErrNotHeld when no owner is
// recorded. Remaining is 0: the table keeps no time. A grant whose holder
// stopped renewing stays recorded until another owner takes it.
func (b *Backend) Holder(ctx context.Context, name string) (driver.Holder, error) {
	out, err := b.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(b.table), Key: b.key(name), ConsistentRead: aws.Bool(true),
		ProjectionExpression:     aws.String("#own, #tok"),
		ExpressionAttributeNames: map[string]string{"#own": attrOwner, "#tok": attrToken},
	})
	if err != nil {
		return driver.Holder{}, b.storeError("read", name, err)
	}
	owner, ok := out.Item[attrOwner].(*types.AttributeValueMemberS)
	if !ok {
		return driver.Holder{}, fmt.Errorf("%w: %q is free", driver.ErrNotHeld, name)
	}
	tok, err := tokenOf(out.Item)
	if err != nil {
		return driver.Holder{}, fmt.Errorf("dynamolease: read %q: %w", name, err)
	}
	return driver.Holder{Name: name, Owner: owner.Value, Token: tok}, nil
}

// Check reads the table's description: nil when it exists with a string
// partition key named Options.KeyAttribute and no sort key; a
// *driver.SetupError (matching driver.ErrSetup) naming the fix when it is
// missing, has another key, or access is refused; the server's error
// otherwise. It writes nothing.
func (b *Backend) Check(ctx context.Context) error {
	out, err := b.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(b.table)})
	if err != nil {
		return b.storeError("check table", b.table, err)
	}
	var hash, sort string
	attrTypes := map[string]types.ScalarAttributeType{}
	if out.Table != nil {
		for _, d := range out.Table.AttributeDefinitions {
			attrTypes[aws.ToString(d.AttributeName)] = d.AttributeType
		}
		for _, k := range out.Table.KeySchema {
			if k.KeyType == types.KeyTypeHash {
				hash = aws.ToString(k.AttributeName)
			} else {
				sort = aws.ToString(k.AttributeName)
			}
		}
	}
	if hash != b.opts.KeyAttribute || sort != "" || attrTypes[hash] != types.ScalarAttributeTypeS {
		return &driver.SetupError{Fix: fmt.Sprintf("table %s must have a string partition key %q and no sort key (it has partition key %q of type %q and sort key %q); %s",
			b.table, b.opts.KeyAttribute, hash, attrTypes[hash], sort, b.createFix())}
	}
	return nil
}

func (b *Backend) createFix() string {
	return fmt.Sprintf("create it with dynamolease.CreateTable, or: aws dynamodb create-table --table-name %s --attribute-definitions AttributeName=%s,AttributeType=S --key-schema AttributeName=%s,KeyType=HASH --billing-mode PAY_PER_REQUEST",
		b.table, b.opts.KeyAttribute, b.opts.KeyAttribute)
}

// storeError wraps a store error, as a *driver.SetupError when retrying
// cannot fix it (a missing table, refused credentials or access).
func (b *Backend) storeError(op, name string, err error) error {
	err = fmt.Errorf("dynamolease: %s %q: %w", op, name, err)
	var rnf *types.ResourceNotFoundException
	if errors.As(err, &rnf) {
		return &driver.SetupError{Err: err, Fix: "table " + b.table + " does not exist: " + b.createFix()}
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException", "MissingAuthenticationTokenException":
			return &driver.SetupError{Err: err, Fix: "the credentials or their permissions are refused: grant dynamodb:UpdateItem, GetItem and DescribeTable on table " + b.table}
		}
	}
	return err
}

// CreateTableAPI is the part of *dynamodb.Client CreateTable uses.
type CreateTableAPI interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
}

// CreateTable creates a lease table with a string partition key keyAttr
// ("" means DefaultKeyAttribute) and on-demand billing, and waits until it
// is active. A table that exists already is no error. ctx bounds the call.
func CreateTable(ctx context.Context, client CreateTableAPI, table, keyAttr string) error {
	if keyAttr == "" {
		keyAttr = DefaultKeyAttribute
	}
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(keyAttr), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(keyAttr), KeyType: types.KeyTypeHash}},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("dynamolease: create table %s: %w", table, err)
	}
	for {
		out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if err != nil {
			return fmt.Errorf("dynamolease: create table %s: %w", table, err)
		}
		if out.Table != nil && out.Table.TableStatus == types.TableStatusActive {
			return nil
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("dynamolease: create table %s: %w", table, ctx.Err())
		case <-t.C:
		}
	}
}
