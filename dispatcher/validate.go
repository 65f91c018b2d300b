package dispatcher

import (
	"fmt"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// targ is a named tensor argument in one of its three shapes, as the
// generated validation passes it. It is a value type so that checks on the
// success path do not allocate.
type targ struct {
	name  string
	one   *tensor.Tensor
	list  []*tensor.Tensor
	lists [][]*tensor.Tensor
	shape byte // 'o', 'l' or 'L'
}

func list(name string, ts []*tensor.Tensor) targ { return targ{name: name, list: ts, shape: 'l'} }

// setOne, setList and setLists fill a zero view in place, as the
// generated methods make theirs: a view returned by value (as list's) is
// built in a temporary and copied, 80 bytes whose narrow stores
// the copy's wide loads cannot forward from (a stall of ~10 cycles each).
func (a *targ) setOne(name string, t *tensor.Tensor) { a.name, a.one, a.shape = name, t, 'o' }

func (a *targ) setList(name string, ts []*tensor.Tensor) { a.name, a.list, a.shape = name, ts, 'l' }

func (a *targ) setLists(name string, tss [][]*tensor.Tensor) {
	a.name, a.lists, a.shape = name, tss, 'L'
}

func (a *targ) each(fn func(t *tensor.Tensor, i, j int) bool) bool {
	switch a.shape {
	case 'o':
		return fn(a.one, -1, -1)
	case 'l':
		for i, t := range a.list {
			if !fn(t, i, -1) {
				return false
			}
		}
	case 'L':
		for i, l := range a.lists {
			for j, t := range l {
				if !fn(t, i, j) {
					return false
				}
			}
		}
	}
	return true
}

// label names one tensor of the argument: "input", "tensors[2]", "outputs[0][3]".
func (a *targ) label(i, j int) string {
	switch {
	case i < 0:
		return a.name
	case j < 0:
		return fmt.Sprintf("%s[%d]", a.name, i)
	}
	return fmt.Sprintf("%s[%d][%d]", a.name, i, j)
}

// length is the number of top-level elements.
func (a *targ) length() int {
	switch a.shape {
	case 'o':
		return 1
	case 'l':
		return len(a.list)
	}
	return len(a.lists)
}

// checker runs an op's argument rules. The first failure is kept; later
// rules are skipped.
type checker struct {
	pg  *ProcessGroup // its rank and size are the op's
	op  backend.Op
	err error
}

func (c *checker) failf(msg, format string, args ...any) {
	if c.err != nil {
		return
	}
	detail := msg
	if format != "" {
		detail += " (" + fmt.Sprintf(format, args...) + ")"
	}
	c.err = &backend.OpError{Op: c.op.String(), Rank: c.pg.rank, Kind: backend.ErrInvalidArgument, Detail: detail}
}

func (c *checker) nonEmpty(msg string, a *targ) {
	if a.shape != 'l' || len(a.list) == 0 {
		c.nonEmptyAny(msg, a) // inline above: a list, the rule's usual argument
	}
}

// nonEmptyAny is nonEmpty for any shape.
func (c *checker) nonEmptyAny(msg string, a *targ) {
	if a.length() == 0 {
		c.failEmpty(msg, a.name) // failf keeps an earlier failure
	}
}

// failEmpty is nonEmpty's failure, out of line so that nonEmpty inlines.
func (c *checker) failEmpty(msg, name string) { c.failf(msg, "%s is empty", name) }

func (c *checker) single(msg string, a *targ) {
	if c.err == nil && a.length() != 1 {
		c.failf(msg, "%s has %d elements", a.name, a.length())
	}
}

func (c *checker) listLen(msg string, a *targ, want int) {
	if c.err == nil && a.length() != want {
		c.failf(msg, "len(%s) = %d, want %d", a.name, a.length(), want)
	}
}

// innerLen checks every inner list of a list of lists.
func (c *checker) innerLen(msg string, a *targ, want int) {
	for i, l := range a.lists {
		if c.err == nil && len(l) != want {
			c.failf(msg, "len(%s[%d]) = %d, want %d", a.name, i, len(l), want)
		}
	}
}

// loneTensor returns the argument's tensor when it holds exactly one (a
// single tensor, or a list of one), the shape of most calls; i is its
// index in its list, -1 for a single one. Small enough to inline, as are
// isLone, loneDevice and lone, which the hot path calls.
func (a *targ) loneTensor() (t *tensor.Tensor, i int, ok bool) {
	switch {
	case a.shape == 'o':
		return a.one, -1, true
	case a.shape == 'l' && len(a.list) == 1:
		return a.list[0], 0, true
	}
	return nil, 0, false
}

// isLone reports whether the argument holds exactly one tensor.
func (a *targ) isLone() bool { _, _, ok := a.loneTensor(); return ok }

// loneDevice returns the device of the argument's tensor when it holds
// exactly one, non-nil (most calls); ok is false otherwise.
func (a *targ) loneDevice() (d tensor.Device, ok bool) {
	if t, _, lone := a.loneTensor(); lone && t != nil {
		return t.Device(), true
	}
	return tensor.Device{}, false
}

// lone returns the tensor of args when they hold exactly one, the shape
// of most calls (one tensor, or a list of one): the checks then skip the
// walk over the arguments. i is its index in its list, -1 for a lone one.
func lone(args []*targ) (t *tensor.Tensor, i int, ok bool) {
	if len(args) != 1 {
		return nil, 0, false
	}
	return args[0].loneTensor()
}

func (c *checker) eachTensor(msg string, args []*targ, bad func(t *tensor.Tensor) string) {
	if t, i, ok := lone(args); ok {
		switch {
		case c.err != nil:
		case t == nil:
			c.failf(msg, "%s is nil", args[0].label(i, -1))
		default:
			if why := bad(t); why != "" {
				c.failf(msg, "%s %s", args[0].label(i, -1), why)
			}
		}
		return
	}
	for _, a := range args {
		if c.err != nil {
			return
		}
		a.each(func(t *tensor.Tensor, i, j int) bool {
			if t == nil {
				c.failf(msg, "%s is nil", a.label(i, j))
				return false
			}
			if why := bad(t); why != "" {
				c.failf(msg, "%s %s", a.label(i, j), why)
				return false
			}
			return true
		})
	}
}

func (c *checker) contiguous(msg string, args ...*targ) {
	if t, _, ok := lone(args); ok && t != nil && t.IsContiguous() {
		return // the common case, inlined
	}
	c.eachTensor(msg, args, func(t *tensor.Tensor) string {
		if !t.IsContiguous() {
			return fmt.Sprintf("has strides %v for shape %v", t.Strides(), t.Shape())
		}
		return ""
	})
}

// first returns the first non-nil tensor of args, or nil.
func first(args []*targ) *tensor.Tensor {
	if t, _, ok := lone(args); ok {
		return t
	}
	var out *tensor.Tensor
	for _, a := range args {
		a.each(func(t *tensor.Tensor, _, _ int) bool {
			out = t
			return t == nil
		})
		if out != nil {
			return out
		}
	}
	return nil
}

// sameAs fails on the first tensor whose key differs from the first
// tensor's; why formats the two keys.
func sameAs[K comparable](c *checker, msg string, args []*targ, key func(*tensor.Tensor) K, why string) {
	if _, _, ok := lone(args); ok {
		return // one tensor is the same as itself (a nil one fails elsewhere)
	}
	ref := first(args)
	if ref == nil {
		return
	}
	want := key(ref)
	c.eachTensor(msg, args, func(t *tensor.Tensor) string {
		if got := key(t); got != want {
			return fmt.Sprintf(why, got, want)
		}
		return ""
	})
}

func (c *checker) sameDType(msg string, args ...*targ) {
	sameAs(c, msg, args, (*tensor.Tensor).DType, "is %v, others are %v")
}

func (c *checker) sameDevice(msg string, args ...*targ) {
	sameAs(c, msg, args, (*tensor.Tensor).Device, "is on %v, others on %v")
}

func (c *checker) sameNumel(msg string, args ...*targ) {
	sameAs(c, msg, args, (*tensor.Tensor).Numel, "has %d elements, others %d")
}

func (c *checker) root(msg string, root int) {
	if c.err == nil && (root < 0 || root >= c.pg.size) {
		c.failf(msg, "root %d, world size %d", root, c.pg.size)
	}
}

func (c *checker) rootTensor(msg string, idx int, a *targ) {
	if c.err == nil && (idx < 0 || idx >= a.length()) {
		c.failf(msg, "root tensor %d, %s has %d", idx, a.name, a.length())
	}
}

func (c *checker) peer(msg string, peer int) {
	switch {
	case c.err != nil:
	case peer < 0 || peer >= c.pg.size:
		c.failf(msg, "rank %d is outside [0, %d)", peer, c.pg.size)
	case peer == c.pg.rank:
		c.failf(msg, "rank %d is this rank; send to or receive from self is not allowed", peer)
	}
}

// worldTimes checks numel(big) == size*numel(small), pairwise for lists.
func (c *checker) worldTimes(msg string, big, small *targ) {
	if c.err != nil {
		return
	}
	if big.length() != small.length() {
		c.failf(msg, "%d %s for %d %s", big.length(), big.name, small.length(), small.name)
		return
	}
	for i := 0; i < big.length(); i++ {
		b, s := big.one, small.one
		if big.shape == 'l' {
			b, s = big.list[i], small.list[i]
		}
		if b == nil || s == nil {
			c.failf(msg, "%s is nil", big.label(i, -1))
			return
		}
		if b.Numel() != c.pg.size*s.Numel() {
			c.failf(msg, "%s has %d elements, %s has %d, world size %d", big.label(idx(big, i), -1), b.Numel(), small.label(idx(small, i), -1), s.Numel(), c.pg.size)
			return
		}
	}
}

// idx maps a pair index to a label index: -1 for single tensors.
func idx(a *targ, i int) int {
	if a.shape == 'o' {
		return -1
	}
	return i
}

func (c *checker) reduceOp(msg string, op backend.ReduceOp, args ...*targ) {
	if t, _, ok := lone(args); ok && t != nil && op.ValidFor(t.DType()) == nil {
		return // the common case, inlined
	}
	c.reduceOpSlow(msg, op, args)
}

func (c *checker) reduceOpSlow(msg string, op backend.ReduceOp, args []*targ) {
	if c.err != nil {
		return
	}
	ref := first(args)
	if ref == nil {
		return
	}
	if err := op.ValidFor(ref.DType()); err != nil {
		c.failf(msg, "%v", err)
	}
}

func (c *checker) splits(msg string, splits []int, a *targ) {
	if c.err != nil || len(splits) == 0 || a.one == nil {
		return
	}
	if len(splits) != c.pg.size {
		c.failf(msg, "%d split sizes for world size %d", len(splits), c.pg.size)
		return
	}
	rows := a.one.Numel()
	if a.one.Dim() > 0 {
		rows = a.one.Shape()[0]
	}
	sum := 0
	for i, s := range splits {
		if s < 0 {
			c.failf(msg, "split %d is negative (%d)", i, s)
			return
		}
		sum += s
	}
	if sum != rows {
		c.failf(msg, "split sizes %v sum to %d, %s has %d rows", splits, sum, a.name, rows)
	}
}

// rootedLists checks the list of lists of a gather (outputs) or scatter
// (inputs): on the root one list of world-size tensors of ref's size,
// elsewhere nothing.
func (c *checker) rootedLists(msg string, root int, a *targ, ref *targ) {
	if c.err != nil {
		return
	}
	if c.pg.rank != root {
		if len(a.lists) != 0 {
			c.failf(msg, "rank %d is not the root but %s has %d lists", c.pg.rank, a.name, len(a.lists))
		}
		return
	}
	if len(a.lists) != 1 || len(a.lists[0]) != c.pg.size {
		n := -1
		if len(a.lists) == 1 {
			n = len(a.lists[0])
		}
		c.failf(msg, "on the root %s has %d lists (first of %d tensors), want 1 list of %d", a.name, len(a.lists), n, c.pg.size)
		return
	}
	r := first([]*targ{ref})
	if r == nil {
		return
	}
	for j, t := range a.lists[0] {
		if t != nil && t.Numel() != r.Numel() {
			c.failf(msg, "invalid tensor size: %s has %d elements, %s has %d", a.label(0, j), t.Numel(), ref.name, r.Numel())
			return
		}
	}
}

// gatheredLists checks allgather_coalesced: outputs[i] holds world-size
// tensors of inputs[i]'s size.
func (c *checker) gatheredLists(msg string, outs, ins *targ) {
	if c.err != nil {
		return
	}
	for i, l := range outs.lists {
		if len(l) != c.pg.size {
			c.failf(msg, "%s has %d tensors, world size %d", outs.label(i, -1), len(l), c.pg.size)
			return
		}
		for j, t := range l {
			if t != nil && ins.list[i] != nil && t.Numel() != ins.list[i].Numel() {
				c.failf(msg, "%s has %d elements, %s has %d", outs.label(i, j), t.Numel(), ins.label(i, -1), ins.list[i].Numel())
				return
			}
		}
	}
}

func (c *checker) tag(msg string, tag int) {
	if c.err == nil && tag < 0 {
		c.failf(msg, "tag %d", tag)
	}
}

func (c *checker) nonnegTimeout(msg string, d time.Duration) {
	if c.err == nil && d < 0 {
		c.failf(msg, "timeout %v", d)
	}
}

// flatten lists every tensor of args, for hooks.
func flatten(args ...*targ) []*tensor.Tensor {
	if len(args) == 1 && (args[0] == nil || args[0].shape == 0) {
		return nil // an op without that role's tensors
	}
	if len(args) == 1 && args[0].shape == 'l' {
		// The caller's list itself, capped so that an append copies: the
		// hooks' view costs no allocation on the issue path.
		return args[0].list[:len(args[0].list):len(args[0].list)]
	}
	var out []*tensor.Tensor
	for _, a := range args {
		a.each(func(t *tensor.Tensor, _, _ int) bool {
			out = append(out, t)
			return true
		})
	}
	return out
}
