package blobguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/blobguard"
	"github.com/fencekit/fencekit/fence"
)

// Check passes on a real store set up for the guard, and finds, before
// any write, a bucket that does not exist and credentials the store
// refuses, each as a setup error naming its fix; the guard's writes say
// the same.
func TestCheckNamesEachProblem(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	if err := newGuard(t, rawClient(baseTransport)).Check(ctx); err != nil {
		t.Fatalf("Check on the test bucket = %v", err)
	}
	wantSetup := func(what string, err error, says string) {
		t.Helper()
		var se *fence.SetupError
		if !errors.Is(err, fence.ErrSetup) || !errors.As(err, &se) || !strings.Contains(se.Fix, says) {
			t.Errorf("%s: %v; want a *fence.SetupError whose fix says %q", what, err, says)
		}
		if errors.Is(err, blobguard.ErrPreconditionsIgnored) || errors.Is(err, fence.ErrOutcomeUnknown) {
			t.Errorf("%s: %v: a setup problem taken for something else", what, err)
		}
	}
	missing, err := blobguard.New(rawClient(baseTransport), "fencekit-no-such-bucket-"+strings.ToLower(t.Name()[:8]))
	if err != nil {
		t.Fatal(err)
	}
	wantSetup("Check of a missing bucket", missing.Check(ctx), "create the bucket")
	_, err = missing.Put(ctx, "k", 1, strings.NewReader("x"))
	wantSetup("Put to a missing bucket", err, "create the bucket")

	badKeys := rawClient(baseTransport, func(o *s3.Options) {
		o.Credentials = aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "fencekit-wrong", SecretAccessKey: "wrong", Source: "fencekit test"}, nil
		})
	})
	wrong, err := blobguard.New(badKeys, s3env.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	wantSetup("Check with wrong credentials", wrong.Check(ctx), "credentials")
}
