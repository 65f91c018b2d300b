package dispatcher

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// TestFlightRecorderShapes checks the shapes, dtypes and errors that the
// compact ring slot (inline for a lone tensor of up to frInlineDims
// dimensions, in the slot's side record otherwise) gives back in a dump,
// across a ring that wraps so that each slot is reused by ops of other
// kinds: in place, a lone tensor on each side, lists of several tensors,
// more dimensions than fit inline, a dimension over int32, a nil tensor,
// no tensors, and failed ops next to ones that did not fail.
func TestFlightRecorderShapes(t *testing.T) {
	fr, err := newFlightRecorder(FlightRecorderOptions{Entries: 5, DumpPrefix: filepath.Join(t.TempDir(), "r"), NoDumpOnError: true}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.close()
	a := tensor.New(tensor.Float32, 2, 3)
	b := tensor.New(tensor.BFloat16, 6)
	big := tensor.New(tensor.Float16, 1, 2, 1, 2, 1)
	type want struct {
		in, out     [][]int
		inDT, outDT []string
		err         string
	}
	f32, bf16 := tensor.Float32.String(), tensor.BFloat16.String()
	ops := []struct {
		ins, outs []*tensor.Tensor
		same      bool
		err       error
		w         want
	}{
		{ins: []*tensor.Tensor{a}, same: true, w: want{in: [][]int{{2, 3}}, out: [][]int{{2, 3}}, inDT: []string{f32}, outDT: []string{f32}}},
		{ins: []*tensor.Tensor{a}, outs: []*tensor.Tensor{b}, err: errors.New("boom"),
			w: want{in: [][]int{{2, 3}}, out: [][]int{{6}}, inDT: []string{f32}, outDT: []string{bf16}, err: "boom"}},
		{ins: []*tensor.Tensor{a, b}, outs: []*tensor.Tensor{b, nil},
			w: want{in: [][]int{{2, 3}, {6}}, out: [][]int{{6}, {}}, inDT: []string{f32, bf16}, outDT: []string{bf16, ""}}},
		{ins: []*tensor.Tensor{big}, outs: []*tensor.Tensor{a},
			w: want{in: [][]int{{1, 2, 1, 2, 1}}, out: [][]int{{2, 3}}, inDT: []string{tensor.Float16.String()}, outDT: []string{f32}}},
		{w: want{in: [][]int{}, out: [][]int{}, inDT: []string{}, outDT: []string{}}},
	}
	if math.MaxInt > math.MaxInt32 {
		// A dimension past int32, as a stride-0 view of one byte (the
		// recorder reads shapes only).
		huge, err := tensor.New(tensor.Uint8, 1).AsStrided([]int{1, math.MaxInt32 + 1}, []int{0, 0})
		if err != nil {
			t.Fatal(err)
		}
		hs := []int{1, math.MaxInt32 + 1}
		ops = append(ops, ops[0])
		ops[len(ops)-1].ins = []*tensor.Tensor{huge}
		ops[len(ops)-1].w = want{in: [][]int{hs}, out: [][]int{hs}, inDT: []string{tensor.Uint8.String()}, outDT: []string{tensor.Uint8.String()}}
	}
	ctx := context.Background()
	// Three passes over a ring of 5: every slot sees several kinds of op.
	for pass := range 3 {
		var wants []want
		for k := range len(ops) + 2 {
			o := ops[(k+pass)%len(ops)]
			outs := o.outs
			if o.same {
				outs = o.ins
			}
			info := OpInfo{Group: "0", Op: backend.OpAllreduce, Backend: "reccpu", Seq: uint64(k + 1), Peer: -1, Inputs: o.ins, Outputs: outs}
			var w backend.Work
			if o.err == nil {
				w = backend.CompletedWork(info.Seq, nil, nil)
			}
			fr.record(ctx, info, w, o.err)
			wants = append(wants, o.w)
		}
		d := fr.Snapshot("test")
		wants = wants[len(wants)-len(d.Entries):]
		for i, e := range d.Entries {
			w := wants[i]
			got := want{in: e.InputSizes, out: e.OutputSizes, inDT: e.InputDtypes, outDT: e.OutputDtypes, err: e.Error}
			if len(got.err) > len(w.err) && w.err != "" {
				got.err = got.err[:len(w.err)]
			}
			if !reflect.DeepEqual(got, w) {
				t.Errorf("pass %d, entry %d (record %d): got %+v, want %+v", pass, i, e.RecordID, got, w)
			}
		}
	}
}
