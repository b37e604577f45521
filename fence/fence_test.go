package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

func TestStaleErrorMatchesSentinel(t *testing.T) {
	err := fmt.Errorf("write row: %w", fence.Stale("orders/42", 7, 9))
	if !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("errors.Is(%v, ErrStaleToken) = false", err)
	}
	if errors.Is(err, fence.ErrInvalidToken) {
		t.Fatalf("stale error must not match ErrInvalidToken")
	}
	se, ok := fence.AsStale(err)
	if !ok {
		t.Fatalf("AsStale(%v) found nothing", err)
	}
	if se.Resource != "orders/42" || se.Presented != 7 || se.Current != 9 {
		t.Fatalf("AsStale = %+v", se)
	}
	want := "write row: fence: stale token for orders/42: presented 7, current 9"
	if err.Error() != want {
		t.Fatalf("Error() = %q, want %q", err.Error(), want)
	}
	if _, ok := fence.AsStale(errors.New("other")); ok {
		t.Fatalf("AsStale matched an unrelated error")
	}
}

func TestTokenValidate(t *testing.T) {
	for _, tc := range []struct {
		tok     fence.Token
		wantErr bool
	}{
		{0, true},
		{fence.None, true},
		{1, false},
		{^fence.Token(0), false},
	} {
		err := tc.tok.Validate()
		if (err != nil) != tc.wantErr {
			t.Errorf("Token(%d).Validate() = %v, wantErr %v", tc.tok, err, tc.wantErr)
		}
		if err != nil && !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("Token(%d).Validate() = %v, does not match ErrInvalidToken", tc.tok, err)
		}
		if tc.tok.IsZero() != tc.wantErr {
			t.Errorf("Token(%d).IsZero() = %v", tc.tok, tc.tok.IsZero())
		}
	}
	if got := fence.Token(18446744073709551615).String(); got != "18446744073709551615" {
		t.Errorf("String() = %q", got)
	}
}

func TestContext(t *testing.T) {
	ctx := context.Background()
	if _, ok := fence.FromContext(ctx); ok {
		t.Fatal("empty context reported a token")
	}
	if _, ok := fence.FromContext(fence.NewContext(ctx, 0)); ok {
		t.Fatal("zero token reported as present")
	}
	got, ok := fence.FromContext(fence.NewContext(ctx, 42))
	if !ok || got != 42 {
		t.Fatalf("FromContext = %d, %v; want 42, true", got, ok)
	}
}

func ExampleStaleError() {
	// A guard rejects a write presenting token 7 after it accepted token 9.
	err := fmt.Errorf("save invoice: %w", fence.Stale("invoices/2026-11", 7, 9))

	if errors.Is(err, fence.ErrStaleToken) {
		se, _ := fence.AsStale(err)
		fmt.Printf("rejected: presented %d, store has %d\n", se.Presented, se.Current)
	}
	// Output:
	// rejected: presented 7, store has 9
}

// TestStaleErrorWithUnknownCurrent: a guard that could not learn the
// current token (Current is None) says so rather than "current 0".
func TestStaleErrorWithUnknownCurrent(t *testing.T) {
	err := fence.Stale("r", 5, fence.None)
	if got := err.Error(); !strings.Contains(got, "presented 5, current unknown") {
		t.Fatalf("Error() = %q; want it to say the current token is unknown", got)
	}
}
