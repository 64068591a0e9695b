package ctl

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// BuildVersion is the version ledgerctl reports. Release builds set it with
// -ldflags "-X github.com/flowness/ledger/internal/ctl.BuildVersion=v1.2.3";
// otherwise the module version and VCS revision of the build are used.
var BuildVersion = ""

type versionInfo struct {
	Version  string `json:"version"`
	Go       string `json:"go"`
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// Version prints the version of ledgerctl ("version").
func Version(_ context.Context, args []string, stdout, stderr io.Writer) error {
	f := NewFlags("ledgerctl version", "", "Print the version of ledgerctl.", stderr)
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	v := versionInfo{Version: BuildVersion, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Revision = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if v.Version == "" {
		v.Version = "(devel)"
	}
	if f.JSON {
		return writeJSON(stdout, v)
	}
	fmt.Fprintf(stdout, "ledgerctl %s (%s", v.Version, v.Go)
	if v.Revision != "" {
		fmt.Fprintf(stdout, ", revision %s", v.Revision)
		if v.Modified {
			fmt.Fprint(stdout, ", modified")
		}
	}
	fmt.Fprintln(stdout, ")")
	return nil
}
