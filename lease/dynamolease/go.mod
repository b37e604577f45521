module github.com/fencekit/fencekit/lease/dynamolease

go 1.26.0

replace (
	github.com/fencekit/fencekit => ../..
	github.com/fencekit/fencekit/internal/dynamotest => ../../internal/dynamotest
)

require (
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/service/dynamodb v1.74.0
	github.com/aws/smithy-go v1.28.9
	github.com/fencekit/fencekit v0.0.0-00010101000000-000000000000
	github.com/fencekit/fencekit/internal/dynamotest v0.0.0-00010101000000-000000000000
)

require (
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding v1.13.25 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/endpoint-discovery v1.13.12 // indirect
	github.com/fencekit/fencekit/internal/testkit v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0 // indirect
)

replace github.com/fencekit/fencekit/internal/testkit => ../../internal/testkit
