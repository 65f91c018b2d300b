package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// Spec is spec/ops.yaml.
type Spec struct {
	Ops []*OpSpec `yaml:"ops"`
}

// OpSpec is one op of the spec.
type OpSpec struct {
	Name      string    `yaml:"name"`
	GoName    string    `yaml:"go_name"`
	Doc       string    `yaml:"doc"`
	Kind      string    `yaml:"kind"`
	Profiling string    `yaml:"profiling"`
	Flags     []string  `yaml:"flags"`
	Args      []ArgSpec `yaml:"args"`
	Options   []OptSpec `yaml:"options"`
	Rules     []Rule    `yaml:"rules"`
	// Stage is "manual" when internal/stage writes the op's delegation by
	// hand (an op whose staging is not the regular copy-in, copy-back);
	// empty, it is generated (zz_generated_ops.go there).
	Stage string `yaml:"stage"`
}

// ArgSpec is a positional argument.
type ArgSpec struct {
	Name string `yaml:"name"`
	Type string `yaml:"type"`
	Role string `yaml:"role"`
	Doc  string `yaml:"doc"`
}

// OptSpec is a field of the op's options struct.
type OptSpec struct {
	Name    string `yaml:"name"`
	Type    string `yaml:"type"`
	Default string `yaml:"default"`
	Doc     string `yaml:"doc"`
}

// Rule is one argument check.
type Rule struct {
	Check string   `yaml:"check"`
	Args  []string `yaml:"args"`
	Msg   string   `yaml:"msg"`
}

var (
	kinds    = map[string]string{"collective": "Collective", "p2p": "P2P", "barrier": "Barrier"}
	flagSet  = map[string]bool{"coalescable": true, "rooted": true, "reduces": true, "uneven": true}
	argTypes = map[string]bool{"tensor": true, "tensors": true, "tensor_lists": true, "rank": true}
	roles    = map[string]bool{"in": true, "out": true, "inout": true}
	// zeroDefaults is the default each option type must declare: the Go
	// zero value, so that a zero options struct means "all defaults".
	zeroDefaults = map[string][]string{
		"bool": {"false"}, "int": {"0"}, "duration": {"0"}, "reduce_op": {"SUM"}, "ints": {"[]"},
	}
	// checks maps each rule to the kinds of its arguments: t = tensor args
	// (variadic), l = one list arg, o = an option, n = "world" or a list
	// arg, r = a rank arg.
	checks = map[string]string{
		"nonempty": "l", "single": "l", "list_len": "ln", "inner_len": "ln", "contiguous": "t", "same_dtype": "t",
		"same_device": "t", "same_numel": "t", "root": "o", "root_tensor": "ol", "peer": "r",
		"world_times": "ll", "reduce_op": "ot", "splits": "ol", "rooted_lists": "oll",
		"tag": "o", "nonneg_timeout": "o", "gathered_lists": "ll",
	}
	snake = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// LoadSpec reads and checks a spec file.
func LoadSpec(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}

func (s *Spec) check() error {
	if len(s.Ops) == 0 {
		return fmt.Errorf("no ops")
	}
	seen := map[string]bool{}
	for _, op := range s.Ops {
		if !snake.MatchString(op.Name) {
			return fmt.Errorf("op %q: name must be snake_case", op.Name)
		}
		if seen[op.Name] {
			return fmt.Errorf("op %q declared twice", op.Name)
		}
		seen[op.Name] = true
		if op.GoName == "" {
			op.GoName = camel(op.Name)
		}
		if err := op.check(); err != nil {
			return fmt.Errorf("op %q: %w", op.Name, err)
		}
	}
	return nil
}

func (op *OpSpec) check() error {
	if strings.TrimSpace(op.Doc) == "" || !strings.HasPrefix(op.Doc, op.GoName+" ") {
		return fmt.Errorf("doc must start with %q", op.GoName+" ")
	}
	if _, ok := kinds[op.Kind]; !ok {
		return fmt.Errorf("kind %q is not collective, p2p or barrier", op.Kind)
	}
	if op.Profiling == "" {
		return fmt.Errorf("profiling name missing")
	}
	if op.Stage != "" && op.Stage != "manual" {
		return fmt.Errorf("stage %q is neither empty nor manual", op.Stage)
	}
	for _, f := range op.Flags {
		if !flagSet[f] {
			return fmt.Errorf("unknown flag %q", f)
		}
	}
	args := map[string]string{}
	for _, a := range op.Args {
		if !argTypes[a.Type] {
			return fmt.Errorf("arg %q: unknown type %q", a.Name, a.Type)
		}
		if a.Type != "rank" && !roles[a.Role] {
			return fmt.Errorf("arg %q: role must be in, out or inout", a.Name)
		}
		if a.Name == "ctx" || a.Name == "opts" || a.Name == "m" || args[a.Name] != "" {
			return fmt.Errorf("arg %q: name reserved or repeated", a.Name)
		}
		args[a.Name] = a.Type
	}
	opts := map[string]string{}
	for _, o := range op.Options {
		want, ok := zeroDefaults[o.Type]
		if !ok {
			return fmt.Errorf("option %s: unknown type %q", o.Name, o.Type)
		}
		if o.Default != want[0] {
			return fmt.Errorf("option %s: default %q must be the zero value %q", o.Name, o.Default, want[0])
		}
		opts[o.Name] = o.Type
	}
	for _, r := range op.Rules {
		sig, ok := checks[r.Check]
		if !ok {
			return fmt.Errorf("rule %q: unknown check", r.Check)
		}
		if r.Msg == "" {
			return fmt.Errorf("rule %q: msg missing", r.Check)
		}
		if sig[0] == 't' {
			if len(r.Args) == 0 {
				return fmt.Errorf("rule %q: needs tensor arguments", r.Check)
			}
			sig = strings.Repeat("t", len(r.Args))
		} else if sig[len(sig)-1] == 't' {
			sig = sig[:len(sig)-1] + strings.Repeat("t", len(r.Args)-len(sig)+1)
		}
		if len(sig) != len(r.Args) {
			return fmt.Errorf("rule %q: want %d arguments, got %d", r.Check, len(sig), len(r.Args))
		}
		for i, a := range r.Args {
			if err := checkRuleArg(sig[i], a, args, opts); err != nil {
				return fmt.Errorf("rule %q: %w", r.Check, err)
			}
		}
	}
	return nil
}

func checkRuleArg(kind byte, a string, args, opts map[string]string) error {
	name, isOpt := strings.CutPrefix(a, "opt.")
	switch kind {
	case 'o':
		if !isOpt || opts[name] == "" {
			return fmt.Errorf("%q is not an option of the op", a)
		}
	case 'r':
		if args[a] != "rank" {
			return fmt.Errorf("%q is not a rank argument", a)
		}
	case 'n':
		if a != "world" && (args[a] == "" || args[a] == "rank") {
			return fmt.Errorf("%q is neither world nor a list argument", a)
		}
	case 'l', 't':
		if t := args[a]; t == "" || t == "rank" {
			return fmt.Errorf("%q is not a tensor argument", a)
		}
	}
	return nil
}

func (op *OpSpec) has(flag string) bool {
	for _, f := range op.Flags {
		if f == flag {
			return true
		}
	}
	return false
}

func (op *OpSpec) option(name string) *OptSpec {
	for i := range op.Options {
		if op.Options[i].Name == name {
			return &op.Options[i]
		}
	}
	return nil
}

func (op *OpSpec) arg(name string) *ArgSpec {
	for i := range op.Args {
		if op.Args[i].Name == name {
			return &op.Args[i]
		}
	}
	return nil
}

// camel turns snake_case into CamelCase.
func camel(s string) string {
	var b strings.Builder
	for _, p := range strings.Split(s, "_") {
		if p != "" {
			b.WriteString(strings.ToUpper(p[:1]) + p[1:])
		}
	}
	return b.String()
}
