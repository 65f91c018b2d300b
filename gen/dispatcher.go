package main

import (
	"fmt"
	"strconv"
	"strings"

	. "github.com/dave/jennifer/jen"
)

const pkgDispatcher = "github.com/gocoll/gocoll/dispatcher"

// checkMethods maps a rule to the dispatcher checker method that runs it.
var checkMethods = map[string]string{
	"nonempty": "nonEmpty", "single": "single", "list_len": "listLen", "inner_len": "innerLen", "contiguous": "contiguous",
	"same_dtype": "sameDType", "same_device": "sameDevice", "same_numel": "sameNumel", "root": "root",
	"root_tensor": "rootTensor", "peer": "peer", "world_times": "worldTimes", "reduce_op": "reduceOp",
	"splits": "splits", "rooted_lists": "rootedLists", "tag": "tag", "nonneg_timeout": "nonnegTimeout",
	"gathered_lists": "gatheredLists",
}

// targ declares the checker's view of a tensor argument and fills it in
// place (a view returned by value would be built in a temporary and
// copied).
func targ(op *OpSpec, name string) []Code {
	a := op.arg(name)
	set := map[string]string{"tensor": "setOne", "tensors": "setList", "tensor_lists": "setLists"}[a.Type]
	return []Code{Var().Id(argVar(name)).Id("targ"), Id(argVar(name)).Dot(set).Call(Lit(name), Id(name))}
}

// argVar names the local that holds a tensor argument's checker view: the
// generated method builds each view once and passes the checks a pointer
// to it, so that a check costs no copy of the view.
func argVar(name string) string { return "a" + strings.ToUpper(name[:1]) + name[1:] }

// isTensorArg reports whether the op's argument name is a tensor argument.
func isTensorArg(op *OpSpec, name string) bool {
	a := op.arg(name)
	return a != nil && (a.Type == "tensor" || a.Type == "tensors" || a.Type == "tensor_lists")
}

// ruleArg renders one rule argument as the checker method expects it.
func ruleArg(op *OpSpec, kind byte, a string) *Statement {
	if name, ok := strings.CutPrefix(a, "opt."); ok {
		return Id("opts").Dot(name)
	}
	switch kind {
	case 'r':
		return Id(a)
	case 'n':
		if a == "world" {
			return Id("pg").Dot("size")
		}
		if n, err := strconv.Atoi(a); err == nil {
			return Lit(n)
		}
		return Len(Id(a))
	}
	return Op("&").Id(argVar(a))
}

func ruleCall(op *OpSpec, r Rule) *Statement {
	sig := checks[r.Check]
	args := []Code{Lit(r.Msg)}
	for i, a := range r.Args {
		k := sig[min(i, len(sig)-1)]
		args = append(args, ruleArg(op, k, a))
	}
	call := Id("c").Dot(checkMethods[r.Check]).Call(args...)
	if sameAs[r.Check] && len(r.Args) == 1 {
		// One argument holding one tensor (most calls) has nothing to
		// compare: the guard is inline, the check a call.
		return If(Op("!").Id(argVar(r.Args[0])).Dot("isLone").Call()).Block(call)
	}
	return call
}

// sameAs are the checks that compare tensors with each other.
var sameAs = map[string]bool{"same_dtype": true, "same_device": true, "same_numel": true}

// roleNames returns the names of the tensor args whose role is one of want.
func roleNames(op *OpSpec, want ...string) []string {
	var out []string
	for _, a := range op.Args {
		for _, w := range want {
			if a.Role == w {
				out = append(out, a.Name)
			}
		}
	}
	return out
}

// roleArgs returns the views of the tensor args whose role is one of want.
func roleArgs(op *OpSpec, want ...string) []Code {
	var out []Code
	for _, a := range op.Args {
		for _, w := range want {
			if a.Role == w {
				out = append(out, Op("&").Id(argVar(a.Name)))
			}
		}
	}
	return out
}

// genDispatcher writes one ProcessGroup method per op.
func genDispatcher(s *Spec) ([]byte, error) {
	f := NewFilePath(pkgDispatcher)
	f.HeaderComment(header)
	for _, op := range s.Ops {
		params := []Code{Id("ctx").Qual("context", "Context")}
		var callArgs []Code
		for _, a := range op.Args {
			params = append(params, Id(a.Name).Add(argType(a.Type)))
			callArgs = append(callArgs, Id(a.Name))
		}
		params = append(params, Id("opts").Qual(pkgBackend, optionsName(op)))
		callArgs = append([]Code{Id("ctx"), Id("call").Dot("meta")}, append(callArgs, Id("opts"))...)

		// The views of the tensor arguments that the rules or the routing
		// use, in argument order.
		used := map[string]bool{}
		for _, r := range op.Rules {
			for _, a := range r.Args {
				used[a] = isTensorArg(op, a)
			}
		}
		body := []Code{}
		for _, a := range op.Args {
			if isTensorArg(op, a.Name) && (used[a.Name] || a.Role == "in" || a.Role == "out" || a.Role == "inout") {
				body = append(body, targ(op, a.Name)...)
			}
		}
		// The checker is zeroed and started in place, for the same reason.
		body = append(body, Var().Id("c").Id("checker"), Id("c").Dot("start").Call(Id("pg"), Qual(pkgBackend, opConst(op))))
		for _, r := range op.Rules {
			body = append(body, ruleCall(op, r))
		}
		body = append(body, If(Id("c").Dot("err").Op("!=").Nil()).Block(Return(Nil(), Id("c").Dot("err"))))

		// Route by the first tensor argument; ops without tensors go to the
		// group's barrier device.
		tensorArgs := roleArgs(op, "in", "out", "inout")
		var route *Statement
		if len(tensorArgs) == 1 {
			// The lone tensor's device, inline, in most calls.
			v := argVar(roleNames(op, "in", "out", "inout")[0])
			body = append(body,
				List(Id("dev"), Id("lone")).Op(":=").Id(v).Dot("loneDevice").Call(),
				If(Op("!").Id("lone")).Block(Id("dev").Op("=").Id("pg").Dot("deviceOf").Call(tensorArgs...)))
			route = Id("dev")
		} else if len(tensorArgs) > 0 {
			route = Id("pg").Dot("deviceOf").Call(tensorArgs...)
		} else if op.option("DeviceIDs") != nil {
			route = Id("pg").Dot("barrierDevice").Call(Qual(pkgBackend, opConst(op)), Id("opts").Dot("DeviceIDs"))
		} else {
			route = Id("pg").Dot("barrierDevice").Call(Qual(pkgBackend, opConst(op)), Nil())
		}
		body = append(body,
			// call is filled in place: a returned opCall would be copied.
			Var().Id("call").Id("opCall"),
			If(Err().Op(":=").Id("pg").Dot("begin").Call(Id("ctx"), Op("&").Id("call"), Qual(pkgBackend, opConst(op)), Lit(op.Kind == "p2p"), route, Id("opts").Dot("Timeout")), Err().Op("!=").Nil()).Block(Return(Nil(), Err())),
			Id("call").Dot("meta").Dot("Waited").Op("=").Id("wait"),
		)
		// The recorder and the hooks see the tensors and the peer: pre and
		// post get pointers to the views of the op's input and output
		// arguments (each role is one argument; nil for a role the op
		// lacks), which stay on this method's stack.
		roleView := func(roles ...string) (Code, error) {
			names := roleNames(op, roles...)
			switch len(names) {
			case 0:
				return Nil(), nil
			case 1:
				return Op("&").Id(argVar(names[0])), nil
			}
			return nil, fmt.Errorf("op %s: %d %s arguments; the dispatcher notes one", op.Name, len(names), roles[0])
		}
		in, err := roleView("in", "inout")
		if err != nil {
			return nil, err
		}
		out, err := roleView("out", "inout")
		if err != nil {
			return nil, err
		}
		for _, a := range op.Args {
			if a.Type == "rank" {
				body = append(body, Id("call").Dot("peer").Op("=").Id(a.Name))
			}
		}
		body = append(body,
			If(Id("call").Dot("hooks").Op("!=").Nil()).Block(Id("pg").Dot("pre").Call(Id("ctx"), Op("&").Id("call"), in, out)),
			List(Id("w"), Err()).Op(":=").Id("call").Dot("backend").Dot(op.GoName).Call(callArgs...),
			// The blocking form waits, and may hand the Work back.
			If(Id("wait")).Block(Return(Nil(), Id("pg").Dot("waitOp").Call(Id("ctx"), Op("&").Id("call"), in, out, Id("w"), Err()))),
			// Nothing to tell (no recorder, metrics or hooks, and the
			// backend took the op): post's call is skipped.
			If(Id("call").Dot("quiet").Op("&&").Err().Op("==").Nil().Op("&&").Id("w").Op("!=").Nil()).Block(Return(Id("w"), Nil())),
			Return(Id("pg").Dot("post").Call(Id("ctx"), Op("&").Id("call"), in, out, Id("w"), Err())),
		)

		// The two public forms share one body, which takes wait.
		run := "run" + op.GoName
		var names []Code
		for _, a := range op.Args {
			names = append(names, Id(a.Name))
		}
		fwd := func(wait bool) []Code { // a fresh slice per call
			return append(append(append([]Code{Id("ctx")}, names...), Id("opts")), Lit(wait))
		}
		f.Comment(op.Doc)
		f.Comment("")
		f.Comment("It checks the arguments against the rules of spec/ops.yaml (docs/ops.md) and")
		f.Comment("runs on the backend that serves the tensors' device. Errors are *backend.OpError.")
		f.Func().Params(Id("pg").Op("*").Id("ProcessGroup")).Id(op.GoName).Params(params...).Params(Qual(pkgBackend, "Work"), Error()).Block(
			Return(Id("pg").Dot(run).Call(fwd(false)...)))
		f.Comment(fmt.Sprintf("%sWait is %s followed by the Work's Wait, as c10d's async_op=False is:", op.GoName, op.GoName))
		f.Comment("it returns the op's error, or Wait's. No Work escapes, so the backend may")
		f.Comment("reuse the op's record once Wait has returned (backend.Releaser), and a loop")
		f.Comment("of small host ops allocates nothing. Post hooks still see the Work, which")
		f.Comment("is then not reused. For a stream backend, Wait orders ctx's current stream")
		f.Comment("after the op and does not block the host, as the async form's Wait does.")
		f.Func().Params(Id("pg").Op("*").Id("ProcessGroup")).Id(op.GoName+"Wait").Params(params...).Error().Block(
			List(Id("_"), Err()).Op(":=").Id("pg").Dot(run).Call(fwd(true)...),
			Return(Err()))
		f.Comment(fmt.Sprintf("%s is the body of %s and %sWait.", run, op.GoName, op.GoName))
		f.Func().Params(Id("pg").Op("*").Id("ProcessGroup")).Id(run).Params(append(params, Id("wait").Bool())...).Params(Qual(pkgBackend, "Work"), Error()).Block(body...)
	}
	return render(f)
}
