package services

import (
	"context"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// NewDynamoClient returns a DynamoDB client of endpoint (DynamoDB Local:
// any credentials do, so it sends fixed ones) and a function that closes
// its idle connections.
func NewDynamoClient(endpoint string) (*dynamodb.Client, func()) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "fencekit", SecretAccessKey: "fencekit", Source: "fencekit demo"}, nil
		}),
		HTTPClient: &http.Client{Transport: tr},
	}), tr.CloseIdleConnections
}
