package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/knob"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// Debug levels of Config.Debug (GOCOLL_DEBUG, or PyTorch's
// TORCH_DISTRIBUTED_DEBUG): DebugOff (the default) and DebugInfo change
// nothing; DebugDetail checks every collective's fingerprint across the
// ranks before it is issued (see Config.Debug).
const (
	DebugOff    = "off"
	DebugInfo   = "info"
	DebugDetail = "detail"
)

// knobDebug is Config.Debug's knob. Values are case-insensitive, as
// PyTorch's OFF, INFO and DETAIL.
var knobDebug = knob.Knob[string]{Field: "dispatcher.Config.Debug", Env: []string{"GOCOLL_DEBUG", "TORCH_DISTRIBUTED_DEBUG"},
	Default: DebugOff,
	Parse:   func(s string) (string, error) { return strings.ToLower(s), nil },
	Check:   knob.OneOf(DebugOff, DebugInfo, DebugDetail)}

// resolveDebug fills cfg.Debug (lower case) from the environment.
func resolveDebug(cfg *Config, env knob.Env) error {
	v, err := knobDebug.Resolve(env, strings.ToLower(cfg.Debug))
	cfg.Debug = v
	return err
}

// fingerprint is what the ranks must agree on for one collective, in
// words: op, dtype, element count, root and reduce op.
type fingerprint struct {
	op     backend.Op
	dtype  tensor.DType
	count  int // -1: the ranks may pass different counts (all-to-all)
	root   int // -1: no root
	reduce string
}

func (f fingerprint) String() string {
	s := f.op.String()
	if f.count != 0 || f.dtype != 0 {
		s += " " + f.dtype.String()
		if f.count >= 0 {
			s += fmt.Sprintf(" x %d", f.count)
		}
	}
	if f.root >= 0 {
		s += fmt.Sprintf(" root %d", f.root)
	}
	if f.reduce != "" {
		s += " (" + f.reduce + ")"
	}
	return s
}

// encode is the fingerprint's store value; decode reads one back.
func (f fingerprint) encode() []byte {
	return fmt.Appendf(nil, "%d %d %d %d %s", f.op, f.dtype, f.count, f.root, f.reduce)
}

func decodeFingerprint(b []byte) (fingerprint, bool) {
	var f fingerprint
	var op, dt int
	n, _ := fmt.Sscanf(string(b), "%d %d %d %d %s", &op, &dt, &f.count, &f.root, &f.reduce)
	f.op, f.dtype = backend.Op(op), tensor.DType(dt)
	return f, n >= 4
}

// sum adds up the element counts of tensors.
func sum(ts ...*tensor.Tensor) int {
	n := 0
	for _, t := range ts {
		if t != nil {
			n += t.Numel()
		}
	}
	return n
}

// dtypeOf is the dtype of the first tensor, or 0.
func dtypeOf(ts ...*tensor.Tensor) tensor.DType {
	for _, t := range ts {
		if t != nil {
			return t.DType()
		}
	}
	return 0
}

// fpKey is rank r's fingerprint key of collective seq in the group's store.
func fpKey(seq uint64, r int) string {
	return "debug/fp/" + strconv.FormatUint(seq, 10) + "/" + strconv.Itoa(r)
}

// checkFingerprint is the DETAIL check of one collective, before it is
// issued: every rank publishes its fingerprint under the op's sequence
// number and reads everyone's. Ranks that disagree fail the op on every
// rank with ErrInvalidArgument naming them and what each passed; ranks
// that never issue it within the op's timeout fail it with ErrTimeout
// naming them. The check blocks the issuing goroutine until every rank
// has issued the op, as PyTorch's DETAIL mode does (it runs an allgather
// of the fingerprints): it is a debugging aid, off by default.
func (pg *ProcessGroup) checkFingerprint(ctx context.Context, m backend.Meta, fp fingerprint) error {
	if pg.size == 1 {
		return nil
	}
	timeout := m.Timeout
	if timeout <= 0 {
		timeout = pg.timeout
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	fail := func(kind error, ranks []int, detail string, err error) error {
		return &backend.OpError{Op: m.Op.String(), Seq: m.Seq, Rank: pg.rank, Kind: kind, Ranks: ranks, Timeout: timeout, Err: err,
			Detail: detail + " (GOCOLL_DEBUG=detail fingerprint check)"}
	}
	keys := make([]string, pg.size)
	for r := range keys {
		keys[r] = fpKey(m.Seq, r)
	}
	if err := pg.store.Set(cctx, keys[pg.rank], fp.encode()); err != nil {
		return fail(backend.ErrUnavailable, nil, "could not publish the fingerprint", err)
	}
	if err := pg.store.Wait(cctx, keys...); err != nil {
		if !errors.Is(err, store.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return fail(backend.ErrUnavailable, nil, "could not read the fingerprints", err)
		}
		qctx, qcancel := context.WithTimeout(context.Background(), 2*time.Second)
		missing, unknown, _ := pg.absent(qctx, keys)
		qcancel()
		missing = append(missing, unknown...)
		slices.Sort(missing)
		return fail(backend.ErrTimeout, missing, fmt.Sprintf("ranks %v never issued %s seq %d", missing, m.Op, m.Seq), nil)
	}
	vals, err := pg.store.MultiGet(cctx, keys)
	if err != nil {
		return fail(backend.ErrUnavailable, nil, "could not read the fingerprints", err)
	}
	// Every rank passed its check of seq-1 before it published seq's key,
	// so no rank reads this rank's previous key any more.
	if m.Seq > 1 {
		_, _ = pg.store.DeleteKey(cctx, fpKey(m.Seq-1, pg.rank))
	}
	fps := make([]fingerprint, pg.size)
	same := true
	for r, v := range vals {
		f, ok := decodeFingerprint(v)
		if !ok {
			return fail(backend.ErrInvalidArgument, []int{r}, fmt.Sprintf("rank %d published a fingerprint that does not parse: %q", r, v), nil)
		}
		fps[r] = f
		same = same && f.agrees(fps[0])
	}
	if same {
		return nil
	}
	ranks, detail := disagreement(fps)
	return fail(backend.ErrInvalidArgument, ranks, detail, nil)
}

// agrees reports whether two ranks' fingerprints of one collective match.
func (f fingerprint) agrees(g fingerprint) bool {
	if f.op != g.op || f.dtype != g.dtype || f.root != g.root || f.reduce != g.reduce {
		return false
	}
	return f.count == g.count || f.count < 0 || g.count < 0
}

// disagreement groups the ranks by fingerprint and names the ranks
// outside the largest group (every rank when no group is larger than all
// others), with what every group passed, in the same words on every rank.
func disagreement(fps []fingerprint) ([]int, string) {
	type group struct {
		fp    fingerprint
		ranks []int
	}
	var groups []*group
	for r, f := range fps {
		found := false
		for _, g := range groups {
			if g.fp.agrees(f) {
				g.ranks, found = append(g.ranks, r), true
				break
			}
		}
		if !found {
			groups = append(groups, &group{fp: f, ranks: []int{r}})
		}
	}
	big := 0
	for i, g := range groups {
		if len(g.ranks) > len(groups[big].ranks) {
			big = i
		}
	}
	for i, g := range groups {
		if i != big && len(g.ranks) == len(groups[big].ranks) {
			big = -1 // no majority: every rank is named
			break
		}
	}
	var odd []int
	parts := make([]string, len(groups))
	for i, g := range groups {
		who := fmt.Sprintf("rank %d", g.ranks[0])
		if len(g.ranks) > 1 {
			who = fmt.Sprintf("ranks %v", g.ranks)
		}
		parts[i] = who + " " + g.fp.String()
		if i != big {
			odd = append(odd, g.ranks...)
		}
	}
	slices.Sort(odd)
	return odd, "the ranks passed different collectives: " + strings.Join(parts, ", ")
}
