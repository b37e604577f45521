package demo

import (
	"context"
	"fmt"
	"io"

	"github.com/fencekit/fencekit/examples/services"
)

// ProvideServices finds or starts the services with services.Provide,
// printing its progress lines on out, then lists on out the services used.
// cfg.Log is replaced.
func ProvideServices(ctx context.Context, cfg services.Config, out io.Writer) (*services.Set, error) {
	cfg.Log = func(f string, a ...any) { fmt.Fprintf(out, "  ... "+f+"\n", a...) }
	svc, err := services.Provide(ctx, cfg)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(out, "Services:")
	for _, u := range svc.Used {
		fmt.Fprintln(out, "  "+u)
	}
	fmt.Fprintln(out)
	return svc, nil
}
