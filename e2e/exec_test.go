//go:build e2e

package e2e

import (
	"context"
	osexec "os/exec"
)

func exec(ctx context.Context, argv ...string) (string, error) {
	out, err := osexec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	return string(out), err
}
