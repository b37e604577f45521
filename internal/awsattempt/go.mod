module github.com/fencekit/fencekit/internal/awsattempt

go 1.26.0

require github.com/aws/smithy-go v1.28.9
