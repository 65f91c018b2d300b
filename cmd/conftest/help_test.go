package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// internalCommands are main's commands that the launchers run, not users.
var internalCommands = map[string]bool{"rank": true, "bench-rank": true}

// TestUsageListsEveryCommand reads main's switch and checks that `conftest
// help` names every command a user may type.
func TestUsageListsEveryCommand(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "main.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	ast.Inspect(f, func(n ast.Node) bool {
		fn, ok := n.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "main" {
			return true
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			if cc, ok := n.(*ast.CaseClause); ok {
				for _, e := range cc.List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						cmds = append(cmds, s)
					}
				}
			}
			return true
		})
		return false
	})
	if len(cmds) < 5 {
		t.Fatalf("found only %v in main's switch", cmds)
	}
	var b strings.Builder
	usage(&b)
	for _, c := range cmds {
		if !internalCommands[c] && !strings.Contains(b.String(), "  conftest "+c) && !strings.Contains(b.String(), "  conftest ["+c+"]") {
			t.Errorf("usage does not list %q:\n%s", c, b.String())
		}
	}
	if strings.Contains(b.String(), "\x1b[") {
		t.Error("usage has colour codes")
	}
}

// TestRunChecksBeforeStart: what every rank would fail on fails the
// launcher before it starts one, naming the value, without colour codes.
func TestRunChecksBeforeStart(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "nosuch"}, `--backend "nosuch": invalid argument: Unknown backend "nosuch" (registered: `},
		{[]string{"--backend", "cpu:cpupool,cuda:nosuch"}, `--backend "cpu:cpupool,cuda:nosuch"`},
		{[]string{"--label-filter", "ops &&"}, `--label-filter "ops &&": Syntax Error Parsing Label Filter: Unexpected EOF.`},
		{[]string{"--focus", "(("}, `--focus "((": error parsing regexp`},
		{[]string{"--nproc", "0"}, "--nproc 0: want at least 1 rank"},
		{[]string{"--nproc", "2", "extra"}, `unexpected arguments ["extra"]`},
	} {
		code, err := run(c.args)
		if code != 2 || err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\x1b") {
			t.Errorf("conftest %v: code %d, %v; want 2 and %q", c.args, code, err, c.want)
		}
	}
}
