package frtrace

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Mismatch kinds, named as PyTorch's analyzer names its match states.
const (
	MissingRank   = "MISSING_RANK"
	TypeMismatch  = "COLLECTIVE_TYPE_MISMATCH"
	SizeMismatch  = "SIZE_OR_SYNTAX_MISMATCH"
	DTypeMismatch = "COLLECTIVE_DTYPE_MISMATCH"
	StateMismatch = "COLLECTIVE_STATE_MISMATCH"
)

// Mismatch is the first collective on which the ranks disagree.
type Mismatch struct {
	Kind   string
	PG     string // group name
	PGDesc string
	Seq    uint64 // collective_seq_id
	Op     string // profiling name on the ranks that have it
	Ranks  []int  // the ranks at fault
	Others []int  // the ranks that agree with each other
	Detail string
}

// String reads, e.g.: rank 1 never enqueued nccl:all_reduce seq 42 of
// group 0 (default_pg); ranks 0,2,3 did.
func (m *Mismatch) String() string {
	return fmt.Sprintf("%s: group %s (%s) seq %d: %s", m.Kind, m.PG, m.PGDesc, m.Seq, m.Detail)
}

// Report is the analyzer's result.
type Report struct {
	Ranks    []int     // ranks whose dumps were read
	NoDump   []int     // group members without a dump
	Checked  int       // collectives compared
	Mismatch *Mismatch // nil when every collective matched
}

// Load reads every JSON flight-recorder dump in dir (files that do not
// parse as a dump are skipped, so the dump directory may hold other files).
func Load(dir string) ([]Dump, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var dumps []Dump
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		var d Dump
		if json.Unmarshal(data, &d) != nil || d.Version == "" || d.PGConfig == nil {
			continue
		}
		dumps = append(dumps, d)
	}
	if len(dumps) == 0 {
		return nil, fmt.Errorf("frtrace: no flight-recorder dumps in %s", dir)
	}
	return dumps, nil
}

// Analyze compares the ranks' collectives, group by group and in sequence
// order, and reports the first one on which they disagree: a rank that
// never enqueued it, a different op, different sizes, dtypes or a
// different state.
func Analyze(dumps []Dump) Report {
	var rep Report
	byRank := map[int]*Dump{}
	for i := range dumps {
		byRank[dumps[i].Rank] = &dumps[i]
		rep.Ranks = append(rep.Ranks, dumps[i].Rank)
	}
	slices.Sort(rep.Ranks)

	// Every group any rank knows, in name order.
	groups := map[string]PGConfig{}
	for _, d := range dumps {
		for name, c := range d.PGConfig {
			groups[name] = c
		}
	}
	names := make([]string, 0, len(groups))
	for n := range groups {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return lessName(names[i], names[j]) })

	var first *Mismatch
	for _, name := range names {
		cfg := groups[name]
		var members []int
		for _, r := range cfg.Ranks {
			if _, ok := byRank[r]; ok {
				members = append(members, r)
			} else if !slices.Contains(rep.NoDump, r) {
				rep.NoDump = append(rep.NoDump, r)
			}
		}
		m, n := analyzeGroup(name, cfg, members, byRank)
		rep.Checked += n
		if m != nil && (first == nil || m.Seq < first.Seq) {
			first = m
		}
	}
	slices.Sort(rep.NoDump)
	rep.Mismatch = first
	return rep
}

// lessName orders group names numerically where they are numbers.
func lessName(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

type rankEntries struct {
	bySeq  map[uint64]*Entry
	minSeq uint64 // the oldest collective still in the ring buffer
}

func analyzeGroup(name string, cfg PGConfig, members []int, byRank map[int]*Dump) (*Mismatch, int) {
	per := map[int]rankEntries{}
	var seqs []uint64
	seen := map[uint64]bool{}
	for _, r := range members {
		re := rankEntries{bySeq: map[uint64]*Entry{}}
		for i := range byRank[r].Entries {
			e := &byRank[r].Entries[i]
			if e.PGID != name || e.IsP2P || e.CollectiveSeqID == 0 {
				continue
			}
			re.bySeq[e.CollectiveSeqID] = e
			if re.minSeq == 0 || e.CollectiveSeqID < re.minSeq {
				re.minSeq = e.CollectiveSeqID
			}
			if !seen[e.CollectiveSeqID] {
				seen[e.CollectiveSeqID] = true
				seqs = append(seqs, e.CollectiveSeqID)
			}
		}
		per[r] = re
	}
	slices.Sort(seqs)
	checked := 0
	for _, seq := range seqs {
		var have, missing []int
		var ref *Entry
		for _, r := range members {
			e := per[r].bySeq[seq]
			switch {
			case e != nil:
				have = append(have, r)
				if ref == nil {
					ref = e
				}
			case per[r].minSeq == 0 || seq > per[r].minSeq:
				// The rank recorded nothing this old or this new: it never
				// enqueued the op. (Older than its ring buffer is unknown.)
				missing = append(missing, r)
			}
		}
		checked++
		mk := func(kind string, bad, good []int, detail string) *Mismatch {
			return &Mismatch{Kind: kind, PG: name, PGDesc: cfg.Desc, Seq: seq, Op: ref.ProfilingName, Ranks: bad, Others: good, Detail: detail}
		}
		if len(missing) > 0 {
			return mk(MissingRank, missing, have, fmt.Sprintf("%s never enqueued %s seq %d; %s did",
				RankList(missing), ref.ProfilingName, seq, RankList(have))), checked
		}
		for _, check := range []struct {
			kind string
			key  func(*Entry) string
		}{
			{TypeMismatch, func(e *Entry) string { return opName(e.ProfilingName) }},
			{SizeMismatch, func(e *Entry) string { return fmt.Sprint(e.InputSizes, e.OutputSizes) }},
			{DTypeMismatch, func(e *Entry) string { return fmt.Sprint(e.InputDtypes, e.OutputDtypes) }},
			{StateMismatch, func(e *Entry) string { return doneState(e.State) }},
		} {
			if m := disagree(per, have, seq, check.key); m != nil {
				return mk(check.kind, m.bad, m.good, fmt.Sprintf("%s has %s; %s %s", RankList(m.bad), m.badVal, RankList(m.good), m.goodVal)), checked
			}
		}
	}
	return nil, checked
}

type split struct {
	bad, good       []int
	badVal, goodVal string
}

// disagree groups the ranks by key and, when they differ, calls the
// majority (ties: the group of the lowest rank) good.
func disagree(per map[int]rankEntries, ranks []int, seq uint64, key func(*Entry) string) *split {
	groups := map[string][]int{}
	var order []string
	for _, r := range ranks {
		k := key(per[r].bySeq[seq])
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	if len(groups) < 2 {
		return nil
	}
	good := order[0]
	for _, k := range order {
		if len(groups[k]) > len(groups[good]) {
			good = k
		}
	}
	s := &split{good: groups[good], goodVal: good}
	for _, k := range order {
		if k != good {
			s.bad = append(s.bad, groups[k]...)
			if s.badVal != "" {
				s.badVal += ", "
			}
			s.badVal += k
		}
	}
	slices.Sort(s.bad)
	return s
}

// opName strips the backend prefix ("nccl:", "gloo:", …) so that traces of
// different backends compare by op.
func opName(profiling string) string {
	if _, op, ok := strings.Cut(profiling, ":"); ok {
		return op
	}
	return profiling
}

// doneState folds started into scheduled: whether a rank noticed the start
// depends on timing being on, so only completion is compared.
func doneState(s string) string {
	if s == StateCompleted {
		return StateCompleted
	}
	return "not completed"
}

// RankList names ranks as the reports do: "rank 1", "ranks 0,2,3", or
// "no rank".
func RankList(rs []int) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprint(r)
	}
	switch len(rs) {
	case 0:
		return "no rank"
	case 1:
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ",")
}

// String is the report as `conftest fr analyze` prints it.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "read dumps of ranks %v; compared %d collectives\n", r.Ranks, r.Checked)
	if len(r.NoDump) > 0 {
		fmt.Fprintf(&b, "no dump from ranks %v\n", r.NoDump)
	}
	if r.Mismatch == nil {
		b.WriteString("all collectives matched\n")
	} else {
		fmt.Fprintf(&b, "first mismatch: %s\n", r.Mismatch)
	}
	return b.String()
}
