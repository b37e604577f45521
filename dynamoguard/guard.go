package dynamoguard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/awsattempt"
	"github.com/fencekit/fencekit/internal/options"
	"github.com/fencekit/fencekit/internal/probeonce"
)

// Options configure a Guard; set them with Option values passed to New.
// The zero value of each field means its default.
type Options struct {
	// VersionAttribute holds the newest accepted token of an item, a
	// number. Default "lock_version". Only the guard may write it.
	VersionAttribute string
	// NonceAttribute holds a random value drawn for each write, which
	// tells a write that an earlier try of it (an SDK retry) already
	// landed. Default "lock_nonce".
	NonceAttribute string
	// DeletedAttribute marks a tombstone written by Delete (a boolean
	// true). Default "lock_deleted".
	DeletedAttribute string

	// Observer, when set, receives a fence.WriteEvent for every Put,
	// Update, Delete and Transact (Guard "dynamoguard", Class the table,
	// Op "put", "update", "delete" or "transaction"), after its outcome is
	// known. Default: none.
	Observer fence.WriteObserver
}

// Option changes Options.
type Option func(*Options)

// WithAttributes sets the names of the guard's three attributes ("" keeps
// a default).
func WithAttributes(version, nonce, deleted string) Option {
	return func(o *Options) {
		o.VersionAttribute, o.NonceAttribute, o.DeletedAttribute = version, nonce, deleted
	}
}

// WithObserver sets Options.Observer.
func WithObserver(o fence.WriteObserver) Option { return func(opts *Options) { opts.Observer = o } }

// Defaults of Options.
const (
	DefaultVersionAttribute = "lock_version"
	DefaultNonceAttribute   = "lock_nonce"
	DefaultDeletedAttribute = "lock_deleted"
)

// maxTransactItems is DynamoDB's limit of 100 actions per transaction, less
// the fence's own.
const maxTransactItems = 99

func (o *Options) setDefaults() {
	if o.VersionAttribute == "" {
		o.VersionAttribute = DefaultVersionAttribute
	}
	if o.NonceAttribute == "" {
		o.NonceAttribute = DefaultNonceAttribute
	}
	if o.DeletedAttribute == "" {
		o.DeletedAttribute = DefaultDeletedAttribute
	}
}

func (o *Options) validate() error {
	var errs []error
	names := map[string]bool{}
	for _, n := range []string{o.VersionAttribute, o.NonceAttribute, o.DeletedAttribute} {
		if len(n) > 255 {
			errs = append(errs, fmt.Errorf("%w: attribute name %.20q... longer than 255 bytes", fence.ErrInvalidArgument, n))
		}
		if names[n] {
			errs = append(errs, fmt.Errorf("%w: attribute name %q used twice", fence.ErrInvalidArgument, n))
		}
		names[n] = true
	}
	return errors.Join(errs...)
}

// Guard makes fenced writes to the items of one DynamoDB table. It is safe
// for concurrent use. Create it with New.
type Guard struct {
	table  string
	client Client
	opts   Options

	mu     sync.Mutex     // guards schema
	schema keySchema      // the table's key attributes, learned by the probe
	gate   probeonce.Gate // the probe's verdict
}

// New returns a Guard for table over client. It does no I/O: the server is
// checked (see Check) before the first call. It returns an error wrapping
// fence.ErrInvalidArgument for a nil client, an empty table name or invalid
// options, reporting every problem at once.
func New(client Client, table string, opts ...Option) (*Guard, error) {
	o := options.Apply(opts)
	o.setDefaults()
	var errs []error
	if client == nil {
		errs = append(errs, fmt.Errorf("%w: nil client", fence.ErrInvalidArgument))
	} else if c, ok := client.(*dynamodb.Client); ok && c == nil {
		errs = append(errs, fmt.Errorf("%w: nil client", fence.ErrInvalidArgument))
	}
	if table == "" {
		errs = append(errs, fmt.Errorf("%w: empty table name", fence.ErrInvalidArgument))
	}
	if err := o.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Guard{client: client, table: table, opts: o}, nil
}

// Options returns the options the Guard runs with, defaults filled in.
func (g *Guard) Options() Options { return g.opts }

// Table returns the table the guard writes to.
func (g *Guard) Table() string { return g.table }

// Put writes item (which must hold the table's key attributes) with token,
// replacing the whole item, unless the stored item holds a newer token:
// one PutItem whose ConditionExpression is
//
//	(attribute_not_exists(lock_version) OR lock_version <= :token)
//	AND (attribute_not_exists(lock_nonce) OR lock_nonce <> :nonce)
//
// with the token and a fresh nonce stored in the item. A write with a token
// equal to the stored one succeeds (the same holder writing again). Put
// creates a missing item and replaces a tombstone.
//
// It returns nil when the write was applied (acknowledged, or an earlier
// try of it found stored by its nonce); a *fence.StaleError (matching
// fence.ErrStaleToken) naming the stored token when a newer one is stored,
// read from the same request (ReturnValuesOnConditionCheckFailure), in
// which case nothing changed; an error matching fence.ErrOutcomeUnknown and
// fence.ErrOutcomeUnknown when the outcome could not be learned;
// fence.ErrNotFenced when the stored version is not a token; fence.ErrInvalidArgument
// before any I/O for a bad token or item; a *fence.SetupError for a missing
// table; the probe's ErrConditionsIgnored; and the server's error
// otherwise. ctx bounds the call, including the probe on first use.
func (g *Guard) Put(ctx context.Context, item map[string]types.AttributeValue, token fence.Token) error {
	return g.observe(ctx, "put", item, token, func() error { return g.putItem(ctx, item, token) })
}

func (g *Guard) putItem(ctx context.Context, item map[string]types.AttributeValue, token fence.Token) error {
	if err := g.checkItem(token, item); err != nil {
		return err
	}
	if err := g.ensureProbed(ctx); err != nil {
		return err
	}
	key, err := g.keyOf(item)
	if err != nil {
		return err
	}
	full := maps.Clone(item)
	return g.put(ctx, token, key, full, false)
}

// Delete removes the item at key on behalf of token, unless a newer token
// is stored there. It does not call DeleteItem: it replaces the item with
// a tombstone (the key, the token, a fresh nonce and lock_deleted = true)
// by the same conditional PutItem as Put, so that a holder with an older
// token can neither delete a newer item nor bring the key back afterwards
// (a deleted item would forget its token, and attribute_not_exists would
// let anyone create it again). Get and Update report fence.ErrNotFound for a
// tombstone; Put replaces it. Deleting a missing key writes a tombstone
// too. Errors are as for Put.
func (g *Guard) Delete(ctx context.Context, key map[string]types.AttributeValue, token fence.Token) error {
	return g.observe(ctx, "delete", key, token, func() error { return g.deleteItem(ctx, key, token) })
}

func (g *Guard) deleteItem(ctx context.Context, key map[string]types.AttributeValue, token fence.Token) error {
	if err := g.checkKeyInput(token, key); err != nil {
		return err
	}
	if err := g.ensureProbed(ctx); err != nil {
		return err
	}
	k, err := g.keyOf(key)
	if err != nil {
		return err
	}
	item := maps.Clone(k)
	item[g.opts.DeletedAttribute] = &types.AttributeValueMemberBOOL{Value: true}
	return g.put(ctx, token, k, item, true)
}

func (g *Guard) put(ctx context.Context, token fence.Token, key, item map[string]types.AttributeValue, tombstone bool) error {
	nonce, err := newNonce()
	if err != nil {
		return err
	}
	if !tombstone {
		delete(item, g.opts.DeletedAttribute)
	}
	item[g.opts.VersionAttribute] = tokenValue(token)
	item[g.opts.NonceAttribute] = &types.AttributeValueMemberS{Value: nonce}
	cond := g.tokenCondition(token).And(g.nonceCondition(nonce))
	expr, err := expression.NewBuilder().WithCondition(cond).Build()
	if err != nil {
		return fmt.Errorf("dynamoguard: build condition: %w", err)
	}
	var tr awsattempt.Tracker
	_, err = g.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(g.table),
		Item:                                item,
		ConditionExpression:                 expr.Condition(),
		ExpressionAttributeNames:            expr.Names(),
		ExpressionAttributeValues:           expr.Values(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, counted(&tr))
	return g.outcome(err, &tr, write{key: key, token: token, nonce: nonce})
}

// Update applies update (an expression.UpdateBuilder: SET, REMOVE, ADD and
// DELETE actions on the caller's attributes) to the existing item at key,
// with token, unless a newer token is stored: one UpdateItem that also sets
// the version to the token and a fresh nonce, under the condition
//
//	attribute_exists(<partition key>) AND attribute_not_exists(lock_deleted)
//	AND (attribute_not_exists(lock_version) OR lock_version <= :token)
//	AND (attribute_not_exists(lock_nonce) OR lock_nonce <> :nonce)
//
// The nonce makes an SDK retry of an applied update fail its condition
// instead of applying the update twice (an ADD would count twice), and the
// guard then reports the update applied. The nonce is one per item: when
// a write with the same token (this holder's, from another goroutine)
// lands between an applied try and the SDK's retry, the retry cannot tell
// its own earlier try from that write and applies again; the guard sees
// this from the retry's answer (UPDATED_OLD: the item held this token and
// another nonce) and returns fence.ErrOutcomeUnknown, since the update was applied
// once or twice. It returns fence.ErrNotFound (nothing
// written) when there is no item at key or a tombstone with a token not
// newer than token, decided from the same request; a *fence.StaleError
// when a newer token is stored (a tombstone's included); other errors as
// for Put. update must not touch the guard's attributes (the server
// refuses overlapping paths with a ValidationException). update is only
// read: a builder may be reused, and shared between goroutines.
func (g *Guard) Update(ctx context.Context, key map[string]types.AttributeValue, token fence.Token, update expression.UpdateBuilder) error {
	return g.observe(ctx, "update", key, token, func() error { return g.updateItem(ctx, key, token, update) })
}

func (g *Guard) updateItem(ctx context.Context, key map[string]types.AttributeValue, token fence.Token, update expression.UpdateBuilder) error {
	_, _, err := g.update(ctx, key, token, update, true)
	return err
}

// update applies update with token to the item at key, as Update does when
// mustExist is set; otherwise it creates the item when it is missing (a
// ledger's claim of a run). It returns the item as it was before the
// update (nil when there was none), and whether that is known: it is not
// when an SDK retry found that an earlier try had landed.
func (g *Guard) update(ctx context.Context, key map[string]types.AttributeValue, token fence.Token, update expression.UpdateBuilder, mustExist bool) (before map[string]types.AttributeValue, known bool, err error) {
	if err := g.checkKeyInput(token, key); err != nil {
		return nil, false, err
	}
	k, nonce, err := g.prepare(ctx, key)
	if err != nil {
		return nil, false, err
	}
	expr, err := g.updateExpression(update, token, nonce, mustExist)
	if err != nil {
		return nil, false, err
	}
	var tr awsattempt.Tracker
	out, err := g.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(g.table),
		Key:                                 k,
		UpdateExpression:                    aws.String(expr.update),
		ConditionExpression:                 aws.String(expr.condition),
		ExpressionAttributeNames:            expr.names,
		ExpressionAttributeValues:           expr.values,
		ReturnValues:                        types.ReturnValueAllOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, counted(&tr))
	if err == nil && tr.Sent() > 1 && g.sameTokenBefore(out.Attributes, token, nonce) {
		return nil, false, fmt.Errorf("%w: update %s: the SDK retried it and the retry was applied over a write with the same token that is not this update's: an earlier try may have been applied too", fence.ErrOutcomeUnknown, g.resource(k))
	}
	if err := g.outcome(err, &tr, write{key: k, token: token, nonce: nonce, mustExist: mustExist}); err != nil {
		return nil, false, err
	}
	if out == nil {
		// An earlier try landed (an SDK retry found its own nonce): the
		// item before it is not known.
		return nil, false, nil
	}
	return out.Attributes, true, nil
}

// sameTokenBefore reports whether old (an applied write's ALL_OLD)
// shows the item held token with a nonce other than nonce: a write of the
// same holder, or an earlier try of this one that it replaced.
func (g *Guard) sameTokenBefore(old map[string]types.AttributeValue, token fence.Token, nonce string) bool {
	v, ok := old[g.opts.VersionAttribute].(*types.AttributeValueMemberN)
	if !ok {
		return false
	}
	if stored, err := strconv.ParseUint(v.Value, 10, 64); err != nil || fence.Token(stored) != token {
		return false
	}
	n, ok := old[g.opts.NonceAttribute].(*types.AttributeValueMemberS)
	return !ok || n.Value != nonce
}

// Get reads the item at key with a strongly consistent GetItem and returns
// it without the guard's attributes, with the token it was written with
// (fence.None for an item no guard wrote). It returns a *NotFoundError
// (matching fence.ErrNotFound) for a missing item or a tombstone, fence.ErrNotFenced
// when the version attribute is not a token, and the server's error
// otherwise. Reads are not fenced: a stale holder can read.
func (g *Guard) Get(ctx context.Context, key map[string]types.AttributeValue) (map[string]types.AttributeValue, fence.Token, error) {
	if key == nil {
		return nil, fence.None, fmt.Errorf("%w: nil key", fence.ErrInvalidArgument)
	}
	if err := g.ensureProbed(ctx); err != nil {
		return nil, fence.None, err
	}
	k, err := g.keyOf(key)
	if err != nil {
		return nil, fence.None, err
	}
	out, err := g.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(g.table), Key: k, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fence.None, g.mapError(fmt.Errorf("dynamoguard: get %s: %w", g.resource(k), err))
	}
	tok, err := g.storedToken(k, out.Item)
	if err != nil {
		return nil, fence.None, err
	}
	if out.Item == nil || g.isTombstone(out.Item) {
		return nil, fence.None, &fence.NotFoundError{Resource: g.resource(k), Tombstone: tok}
	}
	item := maps.Clone(out.Item)
	delete(item, g.opts.VersionAttribute)
	delete(item, g.opts.NonceAttribute)
	delete(item, g.opts.DeletedAttribute)
	return item, tok, nil
}

// Transact writes items (up to 99 TransactWriteItem actions on any tables,
// built as for TransactWriteItems) in one TransactWriteItems request,
// together with a fence: an Update of the item at fenceKey in the guard's
// table that sets its version to token under the condition
// attribute_not_exists(lock_version) OR lock_version <= :token. Either all
// of them are applied or none: a holder with an older token commits
// nothing. The fence item is created if missing; it must not be one of
// items (DynamoDB refuses two actions on one item in a transaction), so a
// resource fenced this way is usually a row of its own, such as the
// lease's name.
//
// The request carries a random ClientRequestToken, so an SDK retry of a
// committed transaction succeeds without applying it twice (DynamoDB keeps
// the token for 10 minutes). It returns nil when the transaction
// committed; a *fence.StaleError naming the fence's stored token (read
// from the same request: ReturnValuesOnConditionCheckFailure on the fence)
// when a newer token is stored, nothing written; an error wrapping
// ErrCanceled and the *types.TransactionCanceledException when the
// transaction was canceled for another reason; an error matching
// fence.ErrOutcomeUnknown when the outcome is unknown (TransactionInProgressException
// included); and fence.ErrInvalidArgument, a *fence.SetupError (ErrConditionsIgnored among them) or
// the server's error as for Put.
func (g *Guard) Transact(ctx context.Context, fenceKey map[string]types.AttributeValue, token fence.Token, items []types.TransactWriteItem) error {
	return g.observe(ctx, "transaction", fenceKey, token, func() error { return g.transact(ctx, fenceKey, token, items) })
}

func (g *Guard) transact(ctx context.Context, fenceKey map[string]types.AttributeValue, token fence.Token, items []types.TransactWriteItem) error {
	return g.transactWith(ctx, fenceKey, token, items, nil, false)
}

// transactWith is Transact whose fence update also sets the attributes of
// set (a ledger's done mark), and, with mustExist, requires the fence
// item to exist (fence.ErrNotFound otherwise).
func (g *Guard) transactWith(ctx context.Context, fenceKey map[string]types.AttributeValue, token fence.Token, items []types.TransactWriteItem,
	set map[string]types.AttributeValue, mustExist bool) error {
	var errs []error
	if err := g.checkKeyInput(token, fenceKey); err != nil {
		errs = append(errs, err)
	}
	if len(items) > maxTransactItems {
		errs = append(errs, fmt.Errorf("%w: %d items, at most %d beside the fence", fence.ErrInvalidArgument, len(items), maxTransactItems))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	k, nonce, err := g.prepare(ctx, fenceKey)
	if err != nil {
		return err
	}
	upd := expression.Set(expression.Name(g.opts.VersionAttribute), expression.Value(tokenValue(token))).
		Set(expression.Name(g.opts.NonceAttribute), expression.Value(nonce))
	for name, v := range set {
		upd = upd.Set(expression.Name(name), expression.Value(v))
	}
	cond := g.tokenCondition(token)
	if mustExist {
		cond = expression.AttributeExists(expression.Name(g.keySchema().partition.name)).And(cond)
	}
	expr, err := expression.NewBuilder().WithUpdate(upd).WithCondition(cond).Build()
	if err != nil {
		return fmt.Errorf("dynamoguard: build fence: %w", err)
	}
	all := append(append(make([]types.TransactWriteItem, 0, len(items)+1), items...), types.TransactWriteItem{
		Update: &types.Update{
			TableName:                           aws.String(g.table),
			Key:                                 k,
			UpdateExpression:                    expr.Update(),
			ConditionExpression:                 expr.Condition(),
			ExpressionAttributeNames:            expr.Names(),
			ExpressionAttributeValues:           expr.Values(),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		},
	})
	var tr awsattempt.Tracker
	_, err = g.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems:      all,
		ClientRequestToken: aws.String(nonce),
	}, counted(&tr))
	if err == nil {
		return nil
	}
	res := g.resource(k)
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		reasons := tce.CancellationReasons
		if len(reasons) == len(all) && aws.ToString(reasons[len(all)-1].Code) == "ConditionalCheckFailed" {
			fenceItem := reasons[len(all)-1].Item
			if fenceItem == nil && mustExist {
				return fmt.Errorf("dynamoguard: transact: %w", &fence.NotFoundError{Resource: res})
			}
			if fenceItem == nil {
				return conditionsIgnored("%s: a canceled transaction did not return the fence item (ReturnValuesOnConditionCheckFailure)", res)
			}
			cur, err := g.storedToken(k, fenceItem)
			if err != nil {
				return err
			}
			if cur <= token {
				return conditionsIgnored("%s: the fence's condition failed, but it holds token %d, not newer than %d", res, cur, token)
			}
			// The ClientRequestToken makes a retry of a committed
			// transaction succeed; a cancel, even after a retry, means no
			// try committed.
			return fence.Stale(res, token, cur)
		}
		return fmt.Errorf("%w: %s: %w", ErrCanceled, res, err)
	}
	return g.failure(fmt.Errorf("dynamoguard: transact %s: %w", res, err), &tr)
}

// updateExpr is an UpdateItem's expressions.
type updateExpr struct {
	update, condition string
	names             map[string]string
	values            map[string]types.AttributeValue
}

// updateExpression builds the caller's update alone (Build only reads the
// builder: adding to it would change the caller's copy, whose operations
// live in a map the copies share, and a builder reused or shared between
// goroutines would then set the version twice), then adds the guard's SET
// actions and condition under placeholders of its own (the builder names
// its own #0, :0, ...). The builder writes one clause a line, each
// starting with its keyword (ADD, DELETE, REMOVE, SET), and no caller text
// (names and values are placeholders): the guard's actions join the SET
// line, or make one.
func (g *Guard) updateExpression(update expression.UpdateBuilder, token fence.Token, nonce string, mustExist bool) (updateExpr, error) {
	e := updateExpr{
		names: map[string]string{
			"#fkv": g.opts.VersionAttribute, "#fkn": g.opts.NonceAttribute,
			"#fkd": g.opts.DeletedAttribute, "#fkk": g.keySchema().partition.name,
		},
		values: map[string]types.AttributeValue{":fkt": tokenValue(token), ":fkn": &types.AttributeValueMemberS{Value: nonce}},
		condition: "attribute_not_exists(#fkd)" +
			" AND (attribute_not_exists(#fkv) OR #fkv <= :fkt) AND (attribute_not_exists(#fkn) OR #fkn <> :fkn)",
	}
	if mustExist {
		e.condition = "attribute_exists(#fkk) AND " + e.condition
	} else {
		delete(e.names, "#fkk")
	}
	const ours = "#fkv = :fkt, #fkn = :fkn"
	built, err := expression.NewBuilder().WithUpdate(update).Build()
	var unset expression.UnsetParameterError
	switch {
	case errors.As(err, &unset):
		e.update = "SET " + ours // no actions of the caller's: the fence alone
		return e, nil
	case err != nil:
		return updateExpr{}, fmt.Errorf("%w: update expression: %w", fence.ErrInvalidArgument, err)
	}
	lines := strings.Split(strings.TrimSpace(aws.ToString(built.Update())), "\n")
	set := false
	for i, l := range lines {
		if strings.HasPrefix(l, "SET ") {
			lines[i], set = l+", "+ours, true
		}
	}
	if !set {
		lines = append(lines, "SET "+ours)
	}
	e.update = strings.Join(lines, "\n")
	for k, v := range built.Names() {
		e.names[k] = v
	}
	for k, v := range built.Values() {
		e.values[k] = v
	}
	return e, nil
}

// prepare probes the server on first use, checks key against the table's
// schema and draws a nonce for one write.
func (g *Guard) prepare(ctx context.Context, key map[string]types.AttributeValue) (map[string]types.AttributeValue, string, error) {
	if err := g.ensureProbed(ctx); err != nil {
		return nil, "", err
	}
	k, err := g.keyOf(key)
	if err != nil {
		return nil, "", err
	}
	nonce, err := newNonce()
	if err != nil {
		return nil, "", err
	}
	return k, nonce, nil
}

// write describes one conditional single-item write, for outcome.
type write struct {
	key       map[string]types.AttributeValue
	token     fence.Token
	nonce     string
	mustExist bool // Update: a missing item is fence.ErrNotFound
}

// outcome classifies the answer to a conditional PutItem or UpdateItem.
func (g *Guard) outcome(err error, tr *awsattempt.Tracker, w write) error {
	if err == nil {
		return nil
	}
	res := g.resource(w.key)
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return g.failure(fmt.Errorf("dynamoguard: write %s: %w", res, err), tr)
	}
	old := ccf.Item
	if old != nil {
		if n, ok := old[g.opts.NonceAttribute].(*types.AttributeValueMemberS); ok && n.Value == w.nonce {
			// An earlier try of this very request landed (an SDK retry
			// found its own nonce): the write was applied.
			return nil
		}
	}
	retried := tr.Retried()
	if old == nil {
		if w.mustExist {
			if retried {
				// The first try may have found the item, updated it, and
				// someone deleted it before the retry.
				return errors.Join(fmt.Errorf("%w: update %s", fence.ErrOutcomeUnknown, res), &fence.NotFoundError{Resource: res})
			}
			return &fence.NotFoundError{Resource: res}
		}
		return conditionsIgnored("%s: a failed condition returned no item (ReturnValuesOnConditionCheckFailure)", res)
	}
	cur, err := g.storedToken(w.key, old)
	if err != nil {
		return err
	}
	var rejection error
	switch {
	case cur > w.token:
		rejection = fence.Stale(res, w.token, cur)
	case w.mustExist && g.isTombstone(old):
		rejection = &fence.NotFoundError{Resource: res, Tombstone: cur}
	default:
		return conditionsIgnored("%s: the condition failed, but the item holds token %d, not newer than %d", res, cur, w.token)
	}
	if retried {
		// An earlier try may have been applied and then replaced.
		return errors.Join(fmt.Errorf("%w: write %s", fence.ErrOutcomeUnknown, res), rejection)
	}
	return rejection
}

// failure classifies an error that is not a failed condition.
func (g *Guard) failure(err error, tr *awsattempt.Tracker) error {
	status := awsattempt.HTTPStatus(err)
	retried := tr.Retried()
	var rnf *types.ResourceNotFoundException
	var inProgress *types.TransactionInProgressException
	switch {
	case errors.As(err, &inProgress):
		return fmt.Errorf("%w: %w", fence.ErrOutcomeUnknown, err)
	case status >= 500:
		return fmt.Errorf("%w: %w", fence.ErrOutcomeUnknown, err)
	case status != 0:
		if retried {
			return fmt.Errorf("%w: %w", fence.ErrOutcomeUnknown, g.mapError(err))
		}
		return g.mapError(err)
	case errors.As(err, &rnf):
		return g.mapError(err)
	case tr.NeverSent():
		return err // never sent
	default:
		return fmt.Errorf("%w: %w", fence.ErrOutcomeUnknown, err)
	}
}

// mapError turns the server's answer that the table is not set up for
// the guard (missing, access or credentials refused) into a
// *fence.SetupError naming the fix.
func (g *Guard) mapError(err error) error {
	var rnf *types.ResourceNotFoundException
	if errors.As(err, &rnf) {
		return &fence.SetupError{Err: fmt.Errorf("%w: %s: %w", fence.ErrNoTable, g.table, err),
			Fix: "create the table (any key schema; the guard adds its attributes to your items), or pass the right name to dynamoguard.New"}
	}
	switch awsattempt.APICode(err) {
	case "AccessDeniedException":
		return &fence.SetupError{Err: err, Fix: "grant dynamodb:DescribeTable, GetItem, PutItem, UpdateItem, DeleteItem and TransactWriteItems (ConditionCheck, Put, Update) on table " + g.table}
	case "UnrecognizedClientException", "InvalidSignatureException", "MissingAuthenticationTokenException", "ExpiredTokenException":
		return &fence.SetupError{Err: err, Fix: "give the DynamoDB client valid credentials (access key, secret key, session token) and the table's region"}
	}
	return err
}

func (g *Guard) tokenCondition(token fence.Token) expression.ConditionBuilder {
	lv := expression.Name(g.opts.VersionAttribute)
	return expression.AttributeNotExists(lv).Or(lv.LessThanEqual(expression.Value(tokenValue(token))))
}

func (g *Guard) nonceCondition(nonce string) expression.ConditionBuilder {
	n := expression.Name(g.opts.NonceAttribute)
	return expression.AttributeNotExists(n).Or(n.NotEqual(expression.Value(nonce)))
}

func (g *Guard) isTombstone(item map[string]types.AttributeValue) bool {
	b, ok := item[g.opts.DeletedAttribute].(*types.AttributeValueMemberBOOL)
	return ok && b.Value
}

// storedToken reads the version attribute of item (fence.None when the item
// or the attribute is missing).
func (g *Guard) storedToken(key, item map[string]types.AttributeValue) (fence.Token, error) {
	if item == nil {
		return fence.None, nil
	}
	av, ok := item[g.opts.VersionAttribute]
	if !ok {
		return fence.None, nil
	}
	n, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return fence.None, fmt.Errorf("%w: %s: %s is not a number", fence.ErrNotFenced, g.resource(key), g.opts.VersionAttribute)
	}
	v, err := strconv.ParseUint(n.Value, 10, 63)
	if err != nil || v == 0 {
		return fence.None, fmt.Errorf("%w: %s: %s = %q is not a token", fence.ErrNotFenced, g.resource(key), g.opts.VersionAttribute, n.Value)
	}
	return fence.Token(v), nil
}

func tokenValue(t fence.Token) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(uint64(t), 10)}
}

func validateToken(t fence.Token) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("dynamoguard: %w", err)
	}
	if t > 1<<63-1 {
		return fmt.Errorf("dynamoguard: %w: token %d is above 2^63-1", fence.ErrInvalidToken, t)
	}
	return nil
}

func (g *Guard) checkItem(token fence.Token, item map[string]types.AttributeValue) error {
	var errs []error
	if err := validateToken(token); err != nil {
		errs = append(errs, err)
	}
	if item == nil {
		errs = append(errs, fmt.Errorf("%w: nil item", fence.ErrInvalidArgument))
	}
	for _, a := range []string{g.opts.VersionAttribute, g.opts.NonceAttribute, g.opts.DeletedAttribute} {
		if _, ok := item[a]; ok {
			errs = append(errs, fmt.Errorf("%w: the item sets %q, which only the guard writes", fence.ErrInvalidArgument, a))
		}
	}
	return errors.Join(errs...)
}

func (g *Guard) checkKeyInput(token fence.Token, key map[string]types.AttributeValue) error {
	var errs []error
	if err := validateToken(token); err != nil {
		errs = append(errs, err)
	}
	if key == nil {
		errs = append(errs, fmt.Errorf("%w: nil key", fence.ErrInvalidArgument))
	}
	return errors.Join(errs...)
}

// resource names an item for errors: dynamodb://table/partition[/sort].
func (g *Guard) resource(key map[string]types.AttributeValue) string {
	var b strings.Builder
	b.WriteString("dynamodb://")
	b.WriteString(g.table)
	for _, a := range g.keySchema().attrs() {
		b.WriteByte('/')
		b.WriteString(formatValue(key[a.name]))
	}
	return b.String()
}

func formatValue(av types.AttributeValue) string {
	switch v := av.(type) {
	case *types.AttributeValueMemberS:
		return v.Value
	case *types.AttributeValueMemberN:
		return v.Value
	case *types.AttributeValueMemberB:
		return "0x" + hex.EncodeToString(v.Value)
	default:
		return fmt.Sprintf("%T", av)
	}
}

func newNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("dynamoguard: nonce: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// observe runs write and reports it to the Observer, if there is one, with
// the resource named once the probe has learned the key schema.
func (g *Guard) observe(ctx context.Context, op string, key map[string]types.AttributeValue, token fence.Token, write func() error) error {
	if g.opts.Observer == nil {
		return write()
	}
	e := fence.WriteEvent{Ctx: ctx, Guard: "dynamoguard", Class: g.table, Op: op, Token: token, Start: time.Now()}
	err := write()
	e.Resource = g.resource(key)
	return fence.ObserveWrite(g.opts.Observer, e, err)
}
