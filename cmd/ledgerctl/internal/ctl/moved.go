package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// movedToLab is a command that moved to ledgerlab, the lab's binary. It
// fails with the command to run instead, so that an operator's script
// learns where it went.
func movedToLab(name string) Func {
	return func(_ context.Context, args []string, _, _ io.Writer) error {
		line := strings.Join(append([]string{"ledgerlab", name}, args...), " ")
		return fmt.Errorf("moved to ledgerlab, the lab's binary: run '%s' "+
			"(from a clone: 'go run ./cmd/%s')", line, line)
	}
}
