package dynamolease

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/fencekit/fencekit/fence"
)

// RaiseAPI is the part of *dynamodb.Client RaiseTokens uses.
type RaiseAPI interface {
	Scan(ctx context.Context, in *dynamodb.ScanInput, optFns ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
}

// RaiseTokens is for operators, after a table was restored from a backup or
// a point-in-time recovery: the restored items carry the tokens of the
// backup, older than tokens handed out since, whose holders may still be
// running. It raises the token of every lease item of table to floor where
// it is lower (one UpdateItem per item, conditional on the token being
// lower, so a token is never lowered) and ends the grant it records (its
// owner is removed: the restored holder is not the current one, and any
// holder renewing that grant loses its lease at its next renewal), so the
// next grant of every name gets a token above floor. Pass a floor above
// every token handed out before the restore; tokens are minted from the
// granting hosts' clocks in microseconds, so the current time in
// microseconds (uint64(time.Now().UnixMicro())) is above them when those
// clocks were not ahead of this one (see the package documentation). Run
// it before leases are taken again. keyAttr is the table's partition key
// ("" means DefaultKeyAttribute). It returns how many items it raised, and
// the first error (items raised before it stay raised; running it again
// is harmless). ctx bounds the whole call.
func RaiseTokens(ctx context.Context, client RaiseAPI, table, keyAttr string, floor fence.Token) (int, error) {
	if err := floor.Validate(); err != nil {
		return 0, fmt.Errorf("%w: floor: %w", ErrInvalidInput, err)
	}
	if keyAttr == "" {
		keyAttr = DefaultKeyAttribute
	}
	raised := 0
	var start map[string]types.AttributeValue
	for {
		out, err := client.Scan(ctx, &dynamodb.ScanInput{
			TableName: aws.String(table), ExclusiveStartKey: start, ConsistentRead: aws.Bool(true),
			ProjectionExpression:     aws.String("#k"),
			ExpressionAttributeNames: map[string]string{"#k": keyAttr},
		})
		if err != nil {
			return raised, fmt.Errorf("dynamolease: raise tokens in %s: %w", table, err)
		}
		for _, it := range out.Items {
			_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName:                aws.String(table),
				Key:                      map[string]types.AttributeValue{keyAttr: it[keyAttr]},
				UpdateExpression:         aws.String("SET #tok = :floor REMOVE #own"),
				ConditionExpression:      aws.String("attribute_not_exists(#tok) OR #tok < :floor"),
				ExpressionAttributeNames: map[string]string{"#tok": attrToken, "#own": attrOwner},
				ExpressionAttributeValues: map[string]types.AttributeValue{
					":floor": &types.AttributeValueMemberN{Value: strconv.FormatUint(uint64(floor), 10)},
				},
			})
			var ccf *types.ConditionalCheckFailedException
			switch {
			case err == nil:
				raised++
			case errors.As(err, &ccf):
				// Already at or above floor.
			default:
				return raised, fmt.Errorf("dynamolease: raise tokens in %s: %w", table, err)
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return raised, nil
		}
		start = out.LastEvaluatedKey
	}
}
