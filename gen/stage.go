package main

import (
	. "github.com/dave/jennifer/jen"
)

const pkgStage = "github.com/gocoll/gocoll/internal/stage"

// stageArg returns the host backend's view of an argument inside a staged
// call: sub swaps a device tensor for its pinned host copy.
func stageArg(a ArgSpec) *Statement {
	switch a.Type {
	case "tensor":
		return Id("sub").Call(Id(a.Name))
	case "tensors":
		return Id("list").Call(Id("sub"), Id(a.Name))
	case "tensor_lists":
		return Id("lists").Call(Id("sub"), Id(a.Name))
	}
	return Id(a.Name) // a rank
}

// stageCollect returns the args method that records a for staging: in
// tensors are copied to the host, out and inout ones to the host and back.
func stageCollect(a ArgSpec) *Statement {
	back := a.Role != "in"
	switch {
	case a.Type == "tensor" || a.Type == "tensors":
		name := "in"
		if back {
			name = "out"
		}
		arg := Id(a.Name)
		if a.Type == "tensors" {
			arg = Id(a.Name).Op("...")
		}
		return Dot(name).Call(arg)
	case a.Type == "tensor_lists" && back:
		return Dot("outLists").Call(Id(a.Name))
	case a.Type == "tensor_lists":
		return Dot("inLists").Call(Id(a.Name))
	}
	return nil
}

// genStage writes internal/stage's delegation of every op not marked
// "stage: manual": the op's tensors are collected (inputs first, then what
// it writes), and do runs the host backend's op on their host copies.
func genStage(s *Spec) ([]byte, error) {
	f := NewFilePath(pkgStage)
	f.HeaderComment(header)
	for _, op := range s.Ops {
		if op.Stage == "manual" {
			continue
		}
		params := []Code{Id("ctx").Qual("context", "Context"), Id("m").Qual(pkgBackend, "Meta")}
		for _, a := range op.Args {
			params = append(params, Id(a.Name).Add(argType(a.Type)))
		}
		params = append(params, Id("opts").Qual(pkgBackend, optionsName(op)))
		collect := Id("new").Call(Id("args"))
		n := 0
		for _, role := range []string{"in", "out"} {
			for _, a := range op.Args {
				if a.Type == "rank" || (a.Role == "in") != (role == "in") {
					continue
				}
				collect.Add(stageCollect(a))
				n++
			}
		}
		callArgs := []Code{Id("ctx"), Id("m")}
		for _, a := range op.Args {
			callArgs = append(callArgs, stageArg(a))
		}
		callArgs = append(callArgs, Id("opts"))
		subName := "sub"
		var body []Code
		// Host tensors with nothing staged queued before them go
		// straight to the host backend (hostNow), without the
		// collection, the closure and the list copies.
		var hostChecks []Code
		for _, a := range op.Args {
			switch a.Type {
			case "tensor":
				hostChecks = append(hostChecks, Id("hostTensor").Call(Id(a.Name)))
			case "tensors":
				hostChecks = append(hostChecks, Id("hostTensors").Call(Id(a.Name)))
			case "tensor_lists":
				hostChecks = append(hostChecks, Id("hostLists").Call(Id(a.Name)))
			}
		}
		if len(hostChecks) > 0 {
			cond := hostChecks[0]
			for _, c := range hostChecks[1:] {
				cond = Add(cond, Op("&&"), c)
			}
			direct := []Code{Id("ctx"), Id("m")}
			for _, a := range op.Args {
				direct = append(direct, Id(a.Name))
			}
			direct = append(direct, Id("opts"))
			body = append(body, If(Id("b").Dot("hostNow").Call(cond)).Block(
				Return(Id("b").Dot("inner").Dot(op.GoName).Call(direct...)),
			))
		}
		ts, back := Id("a").Dot("ts"), Id("a").Dot("back")
		if n == 0 {
			subName, ts, back = "_", Nil(), Nil()
		} else {
			body = append(body, Id("a").Op(":=").Add(collect))
		}
		fn := Func().Params(Id("ctx").Qual("context", "Context"), Id("m").Qual(pkgBackend, "Meta"), Id(subName).Id("subFunc")).
			Params(Qual(pkgBackend, "Work"), Error()).Block(
			Return(Id("b").Dot("inner").Dot(op.GoName).Call(callArgs...)),
		)
		body = append(body, Return(Id("b").Dot("do").Call(Id("ctx"), Id("m"), ts, back, fn)))
		f.Commentf("%s implements backend.Backend: the host backend's, on host copies of CUDA tensors.", op.GoName)
		f.Func().Params(Id("b").Op("*").Id("Backend")).Id(op.GoName).Params(params...).Params(Qual(pkgBackend, "Work"), Error()).Block(body...)
	}
	return render(f)
}
