package deploytest

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeFile is the part of the compose specification the tests read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string                       `yaml:"image"`
	Build       any                          `yaml:"build"`
	Entrypoint  stringList                   `yaml:"entrypoint"`
	Command     stringList                   `yaml:"command"`
	Environment envMap                       `yaml:"environment"`
	Ports       []string                     `yaml:"ports"`
	Volumes     []string                     `yaml:"volumes"`
	DependsOn   map[string]composeDependency `yaml:"depends_on"`
	Healthcheck *composeHealthcheck          `yaml:"healthcheck"`
	Restart     string                       `yaml:"restart"`
}

type composeDependency struct {
	Condition string `yaml:"condition"`
}

type composeHealthcheck struct {
	Test stringList `yaml:"test"`
}

// stringList is a compose field that is either a list or one string (split
// on white space, as compose does for command and entrypoint).
type stringList []string

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = strings.Fields(n.Value)
		return nil
	}
	var s []string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*l = s
	return nil
}

// envMap is a service's environment, written as a map or as KEY=value items.
type envMap map[string]string

func (e *envMap) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		var items []string
		if err := n.Decode(&items); err != nil {
			return err
		}
		m := envMap{}
		for _, it := range items {
			k, v, _ := strings.Cut(it, "=")
			m[k] = v
		}
		*e = m
		return nil
	}
	var m map[string]string
	if err := n.Decode(&m); err != nil {
		return err
	}
	*e = m
	return nil
}

func loadCompose(t testing.TB) composeFile {
	t.Helper()
	var c composeFile
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "docker-compose.yml")), &c); err != nil {
		t.Fatalf("deploytest: docker-compose.yml: %v", err)
	}
	return c
}

// buildContext is the directory a service is built from ("" if none).
func (s composeService) buildContext() string {
	switch b := s.Build.(type) {
	case string:
		return b
	case map[string]any:
		if c, ok := b["context"].(string); ok {
			return c
		}
		return "."
	}
	return ""
}

// containerPorts are the container side of the service's published ports
// ("127.0.0.1:9090:9090" → "9090").
func (s composeService) containerPorts() []string {
	var ports []string
	for _, p := range s.Ports {
		p, _, _ = strings.Cut(p, "/")
		ports = append(ports, p[strings.LastIndex(p, ":")+1:])
	}
	return ports
}

// flags returns the names of the flags in args: "-admin-addr=:9091" and
// "--admin-addr :9091" both give "admin-addr".
func flags(args []string) []string {
	var names []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		names = append(names, name)
	}
	return names
}

// subcommand returns the words before the first flag: ["demo"] for
// "demo -external".
func subcommand(args []string) []string {
	for i, a := range args {
		if strings.HasPrefix(a, "-") {
			return args[:i]
		}
	}
	return args
}

// flagValue returns the value given to flag name in args, if any.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		n, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || n != name {
			continue
		}
		if hasValue {
			return v, true
		}
		if i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// portOf returns the port of a listen address (":9091" → "9091").
func portOf(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return port
}

// dockerfile is what the tests read of the Dockerfile.
type dockerfile struct {
	// Stages are the FROM images in order (ARGs declared before the first
	// FROM expanded), with their stage names.
	Stages []dockerStage
	// Built are the command names of ./cmd/<name> packages the go build
	// line compiles; BuildLine is that line.
	Built     []string
	BuildLine string
	// Copied are the files copied from another stage into the final stage,
	// by destination path.
	Copied []string
	// Entrypoint, User and Expose are those of the final stage.
	Entrypoint []string
	User       string
	Expose     []string
	// Runs are the RUN instructions of the final stage.
	Runs []string
}

type dockerStage struct {
	Image, Name string
}

func loadDockerfile(t testing.TB) dockerfile {
	t.Helper()
	d, err := parseDockerfile(readRepoFile(t, "Dockerfile"))
	if err != nil {
		t.Fatalf("deploytest: Dockerfile: %v", err)
	}
	return d
}

// parseDockerfile reads the instructions the tests check. It joins
// continuation lines and ignores comments; it is not a full parser.
func parseDockerfile(src string) (dockerfile, error) {
	var d dockerfile
	var lines []string
	var cur strings.Builder
	for _, raw := range strings.Split(src, "\n") {
		line := strings.TrimSpace(raw)
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	args := map[string]string{}
	for _, line := range lines {
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "ARG":
			if k, v, ok := strings.Cut(rest, "="); ok && len(d.Stages) == 0 {
				args[k] = strings.Trim(v, `"`)
			}
		case "FROM":
			f := strings.Fields(os.Expand(rest, func(k string) string { return args[k] }))
			st := dockerStage{Image: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.Name = f[2]
			}
			d.Stages = append(d.Stages, st)
			d.Copied, d.Entrypoint, d.User, d.Expose, d.Runs = nil, nil, "", nil, nil
		case "RUN":
			d.Runs = append(d.Runs, rest)
			if strings.Contains(rest, "go build") {
				d.BuildLine = rest
				for _, f := range strings.Fields(rest) {
					if strings.HasPrefix(f, "./cmd/") {
						d.Built = append(d.Built, strings.TrimPrefix(f, "./cmd/"))
					}
				}
			}
		case "COPY":
			f := strings.Fields(rest)
			if len(f) < 3 || !strings.HasPrefix(f[0], "--from=") {
				continue
			}
			dst := f[len(f)-1]
			for _, src := range f[1 : len(f)-1] {
				if strings.HasPrefix(src, "--") {
					continue
				}
				d.Copied = append(d.Copied, path.Join(dst, path.Base(src)))
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.Entrypoint); err != nil {
				return d, fmt.Errorf("ENTRYPOINT %s: want the exec (JSON) form: %w", rest, err)
			}
		case "USER":
			d.User = rest
		case "EXPOSE":
			d.Expose = append(d.Expose, strings.Fields(rest)...)
		}
	}
	if len(d.Stages) == 0 {
		return d, fmt.Errorf("no FROM")
	}
	return d, nil
}
