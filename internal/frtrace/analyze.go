package frtrace

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
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

// Job is one job's dumps, as LoadJobs groups them.
type Job struct {
	// ID is the job id of its dumps (Dump.JobID).
	ID string
	// Dumps holds one dump per rank, the newest where a rank has several.
	Dumps []Dump
	// Files are the dumps' file names, in the order of Dumps.
	Files []string
	// Duplicates maps a rank that has more than one dump in the job to
	// the files of the older ones, which are left out.
	Duplicates map[int][]string
	// Newest is the latest dump time of the job.
	Newest time.Time
}

// Ranks returns the ranks of the job's dumps, in order.
func (j *Job) Ranks() []int {
	rs := make([]int, len(j.Dumps))
	for i, d := range j.Dumps {
		rs[i] = d.Rank
	}
	return rs
}

// Loaded is what LoadJobs found in a directory.
type Loaded struct {
	// Jobs are gocoll dumps grouped by job, the newest job first.
	Jobs []Job
	// Skipped counts the files that are not gocoll flight-recorder dumps
	// (other files, PyTorch's or other programs' JSON).
	Skipped int
}

// LoadJobs reads the gocoll flight-recorder dumps in dir and groups them by
// job (run id and default group uid), so that a directory such as /tmp,
// holding other files and older runs' dumps, still yields one job to
// analyze. A file is a gocoll dump when it parses as a dump whose
// comm_lib_version is Producer.
func LoadJobs(dir string) (Loaded, error) {
	var out Loaded
	ents, err := os.ReadDir(dir)
	if err != nil {
		return out, fmt.Errorf("frtrace: %w", err)
	}
	byID := map[string]*Job{}
	var order []string
	for _, de := range ents {
		if !de.Type().IsRegular() {
			continue
		}
		name := filepath.Join(dir, de.Name())
		d, ok := readDump(name)
		if !ok {
			out.Skipped++
			continue
		}
		id := d.JobID()
		j := byID[id]
		if j == nil {
			j = &Job{ID: id, Duplicates: map[int][]string{}}
			byID[id] = j
			order = append(order, id)
		}
		j.add(d, name)
	}
	for _, id := range order {
		j := byID[id]
		sort.Sort(byRank{j})
		out.Jobs = append(out.Jobs, *j)
	}
	sort.SliceStable(out.Jobs, func(a, b int) bool { return out.Jobs[a].Newest.After(out.Jobs[b].Newest) })
	if len(out.Jobs) == 0 {
		return out, fmt.Errorf("frtrace: no gocoll flight-recorder dumps in %s (%d other files)", dir, out.Skipped)
	}
	return out, nil
}

// readDump reads one file as a gocoll dump. Files too large to be a dump
// of the default ring buffer are not read whole.
func readDump(path string) (Dump, bool) {
	var d Dump
	f, err := os.Open(path)
	if err != nil {
		return d, false
	}
	defer f.Close()
	var head [1]byte
	if n, _ := f.Read(head[:]); n == 0 || head[0] != '{' {
		return d, false // not JSON: skip without reading it all
	}
	if _, err := f.Seek(0, 0); err != nil {
		return d, false
	}
	if json.NewDecoder(f).Decode(&d) != nil || d.Version == "" || d.PGConfig == nil || d.CommLibVersion != Producer {
		return d, false
	}
	return d, true
}

// add puts d into the job, keeping the newest dump of each rank.
func (j *Job) add(d Dump, file string) {
	t := time.Unix(0, d.DumpTimeNs)
	if t.After(j.Newest) {
		j.Newest = t
	}
	for i := range j.Dumps {
		if j.Dumps[i].Rank != d.Rank {
			continue
		}
		if d.DumpTimeNs > j.Dumps[i].DumpTimeNs {
			j.Duplicates[d.Rank] = append(j.Duplicates[d.Rank], j.Files[i])
			j.Dumps[i], j.Files[i] = d, file
		} else {
			j.Duplicates[d.Rank] = append(j.Duplicates[d.Rank], file)
		}
		return
	}
	j.Dumps = append(j.Dumps, d)
	j.Files = append(j.Files, file)
}

type byRank struct{ j *Job }

func (b byRank) Len() int           { return len(b.j.Dumps) }
func (b byRank) Less(x, y int) bool { return b.j.Dumps[x].Rank < b.j.Dumps[y].Rank }
func (b byRank) Swap(x, y int) {
	b.j.Dumps[x], b.j.Dumps[y] = b.j.Dumps[y], b.j.Dumps[x]
	b.j.Files[x], b.j.Files[y] = b.j.Files[y], b.j.Files[x]
}

// Load returns the dumps of the newest job in dir (see LoadJobs).
func Load(dir string) ([]Dump, error) {
	l, err := LoadJobs(dir)
	if err != nil {
		return nil, err
	}
	return l.Jobs[0].Dumps, nil
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
