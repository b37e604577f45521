package blobguard

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/awsattempt"
)

// Check is the Guard's start-up check, as lease.Manager.Check is a lease
// backend's: it checks that the bucket exists, that the credentials may
// read and write it, and that the store honours S3 conditional writes,
// writing under Options.ProbePrefix in the guard's bucket (it needs
// GetObject, PutObject and DeleteObject there). It runs, on a fresh key:
//
//  1. a conditional create (If-None-Match: *), which must succeed;
//  2. a second conditional create of the same key, which must fail;
//  3. a write with an If-Match that does not match, which must fail;
//  4. a write with If-Match on a missing key, which must fail;
//  5. a write with the right If-Match, which must succeed;
//  6. a read of the key, which must succeed;
//
// then deletes its objects. It also learns whether the store's ETags are
// the MD5 of the stored bytes, which Get then checks on every read.
//
// It returns nil when the store is fit; a *fence.SetupError naming the
// fix (matching fence.ErrSetup, and so lease.ErrSetup) when it is not: one
// wrapping ErrPreconditionsIgnored when the store fails a check (the
// guard then refuses every call with that error until a later Check
// succeeds: fail closed), or carrying the store's error for a missing
// bucket, or refused access or credentials; and other errors (the store
// cannot be reached) as they are. Get, Put, PutIf and Delete run it on
// their first use, and again after an error that is not a verdict; call
// Check when the program starts to learn of a setup problem then, or
// again after the store changed. ctx bounds the check.
func (g *Guard) Check(ctx context.Context) error { return g.gate.Probe(ctx, g.probe) }

func (g *Guard) ensureProbed(ctx context.Context) error { return g.gate.Ensure(ctx, g.probe) }

// probe runs the checks; its verdict (nil or a refusal) is kept by the
// gate, another error is not.
func (g *Guard) probe(ctx context.Context) (bool, error) {
	md5ETags, err := g.runProbe(ctx)
	if err != nil && !isRefusal(err) {
		return false, err
	}
	g.mu.Lock()
	g.md5ETags = md5ETags
	g.mu.Unlock()
	return true, err
}

// storeErr returns err as a *fence.SetupError naming the fix when the
// store's answer says that it is not set up for the guard (the bucket is
// missing, access or the credentials are refused), and err otherwise.
func (g *Guard) storeErr(err error) error {
	var fix string
	switch awsattempt.APICode(err) {
	case "NoSuchBucket":
		fix = "create the bucket " + g.bucket + ", or pass the right name to blobguard.New"
	case "AccessDenied", "AllAccessDisabled":
		fix = "grant s3:GetObject and s3:PutObject on arn:aws:s3:::" + g.bucket + "/*, and s3:DeleteObject on " +
			g.opts.ProbePrefix + "* (the probe's scratch objects; Options.ProbePrefix)"
	// XAdminUserNotFound is versitygw's answer to an unknown access key.
	case "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "XAdminUserNotFound":
		fix = "give the S3 client valid credentials for the bucket's account (access key, secret key, session token)"
	default:
		return err
	}
	return &fence.SetupError{Err: err, Fix: fix}
}

type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

func isRefusal(err error) bool {
	_, ok := err.(refusal)
	return ok
}

func (g *Guard) runProbe(ctx context.Context) (md5ETags bool, err error) {
	n1, err := newNonce()
	if err != nil {
		return false, err
	}
	n2, err := newNonce()
	if err != nil {
		return false, err
	}
	key := g.opts.ProbePrefix + hex.EncodeToString(n1[:])
	missing := g.opts.ProbePrefix + hex.EncodeToString(n2[:])
	defer func() {
		// Best effort: a scratch object left behind is harmless.
		for _, k := range []string{key, missing} {
			_, _ = g.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(g.bucket), Key: aws.String(k)})
		}
	}()

	refuse := func(what string) error {
		return refusal{&fence.SetupError{
			Err: fmt.Errorf("%w: s3://%s/%s: %s", ErrPreconditionsIgnored, g.bucket, key, what),
			Fix: "use a store that honours If-None-Match and If-Match on PutObject atomically (AWS S3; versitygw v1.8.0 or later), or fix the proxy in front of it that drops them",
		}}
	}
	put := func(k, body string, ifMatch, ifNoneMatch *string) (string, outcome, error) {
		in := &s3.PutObjectInput{
			Bucket: aws.String(g.bucket), Key: aws.String(k),
			Body: bytes.NewReader([]byte(body)), ContentLength: aws.Int64(int64(len(body))),
			IfMatch: ifMatch, IfNoneMatch: ifNoneMatch,
		}
		for i := 0; ; i++ {
			var tr awsattempt.Tracker
			out, err := g.client.PutObject(ctx, in, counted(&tr))
			if err == nil {
				return aws.ToString(out.ETag), written, nil
			}
			err = fmt.Errorf("blobguard: probe: %w", err)
			status, code := awsattempt.HTTPStatus(err), awsattempt.APICode(err)
			switch {
			case status == 412 || code == "PreconditionFailed":
				return "", preconditionFailed, err
			case status == 404 && code == "NoSuchKey":
				return "", vanished, err
			case status == 409 && i < 3:
				if err := g.sleep(ctx, i+1); err != nil {
					return "", failed, err
				}
				in.Body = bytes.NewReader([]byte(body))
				continue
			}
			return "", failed, g.storeErr(err)
		}
	}
	star := aws.String("*")

	body1 := "fencekit probe 1 " + hex.EncodeToString(n2[:])
	etag1, oc, err := put(key, body1, nil, star)
	switch {
	case oc == preconditionFailed:
		return false, refuse("a conditional create of a new key failed")
	case err != nil:
		return false, err
	case etag1 == "":
		return false, refuse("the store returned no ETag")
	}
	md5ETags = normETag(etag1) == md5Hex([]byte(body1))

	if _, oc, err = put(key, "fencekit probe 2", nil, star); oc == written {
		return false, refuse("a conditional create (If-None-Match: *) of an existing key succeeded")
	} else if oc != preconditionFailed {
		return false, err
	}

	wrong := `"` + md5Hex([]byte("fencekit probe wrong")) + `"`
	if _, oc, err = put(key, "fencekit probe 3", aws.String(wrong), nil); oc == written {
		return false, refuse("a write with an If-Match that does not match succeeded")
	} else if oc != preconditionFailed {
		return false, err
	}

	if _, oc, err = put(missing, "fencekit probe 4", aws.String(etag1), nil); oc == written {
		return false, refuse("a write with If-Match on a missing key succeeded")
	} else if oc != preconditionFailed && oc != vanished {
		return false, err
	}

	if _, oc, err = put(key, "fencekit probe 5", aws.String(etag1), nil); oc == preconditionFailed {
		return false, refuse("a write whose If-Match matched failed: " + err.Error())
	} else if err != nil {
		return false, err
	}

	out, err := g.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(g.bucket), Key: aws.String(key)})
	if err != nil {
		return false, g.storeErr(fmt.Errorf("blobguard: probe: read: %w", err))
	}
	_ = out.Body.Close()
	return md5ETags, nil
}
