package backend

import "fmt"

// Op identifies an op of spec/ops.yaml; the constants are generated.
type Op uint8

// OpKind sorts ops by which sequence counter they use.
type OpKind uint8

const (
	// Collective ops use the group's collective counter.
	Collective OpKind = iota
	// P2P ops (send, recv) use the p2p counter.
	P2P
	// Barrier ops are collectives that order earlier work; they use the
	// collective counter.
	Barrier
)

// String returns "collective", "p2p" or "barrier".
func (k OpKind) String() string {
	switch k {
	case Collective:
		return "collective"
	case P2P:
		return "p2p"
	case Barrier:
		return "barrier"
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// OpInfo is an op's entry in the op table, from spec/ops.yaml.
type OpInfo struct {
	Name        string // snake_case, e.g. "allgather_into_tensor"
	GoName      string // the method name, e.g. "AllgatherIntoTensor"
	Kind        OpKind
	Profiling   string // the flight recorder's name without the backend prefix
	Coalescable bool   // may run inside a coalescing block
	Rooted      bool   // has a root rank
	Reduces     bool   // takes a reduce op
	Uneven      bool   // allows per-rank sizes
	Doc         string
}

// Info returns the op's table entry.
func (o Op) Info() OpInfo {
	if o >= numOps {
		return OpInfo{Name: fmt.Sprintf("Op(%d)", uint8(o))}
	}
	return opTable[o]
}

// Kind returns the op's kind (Info().Kind), without copying its table
// entry: the dispatcher asks it for every op it numbers.
func (o Op) Kind() OpKind {
	if o >= numOps {
		return Collective
	}
	return opTable[o].Kind
}

// String returns the op's spec name.
func (o Op) String() string { return o.Info().Name }

// ProfilingName returns the flight recorder's name, e.g. "nccl:all_reduce".
func (o Op) ProfilingName(backendName string) string {
	return backendName + ":" + o.Info().Profiling
}

// Ops returns every op, in spec order.
func Ops() []Op {
	out := make([]Op, numOps)
	for i := range out {
		out[i] = Op(i)
	}
	return out
}

// LookupOp finds an op by its spec name.
func LookupOp(name string) (Op, bool) {
	for i := range opTable {
		if opTable[i].Name == name {
			return Op(i), true
		}
	}
	return 0, false
}

func unimplemented(o Op) error {
	return &OpError{Op: o.String(), Kind: ErrUnsupported, Detail: "the backend does not implement " + o.Info().GoName}
}
