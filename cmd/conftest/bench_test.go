package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/internal/testgroup"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
	"golang.org/x/sys/unix"
)

// init lets the test binary stand in for conftest where bench starts
// its rank processes (os.Executable): "bench-rank" runs the real rank.
// (An init, not TestMain, which netns_test.go has.)
func init() {
	if len(os.Args) > 1 && os.Args[1] == "bench-rank" {
		if err := benchRank(os.Args[2:]); err != nil {
			os.Stderr.WriteString("bench-rank: " + err.Error() + "\n")
			os.Exit(2)
		}
		os.Exit(0)
	}
}

// TestBusFactor: nccl-tests' factors (doc/PERFORMANCE.md) for every op.
func TestBusFactor(t *testing.T) {
	for _, c := range []struct {
		op   string
		n    int
		want float64
	}{
		{opAllreduce, 1, 0}, {opAllreduce, 2, 1}, {opAllreduce, 4, 1.5}, {opAllreduce, 8, 1.75},
		{opAllgather, 2, 0.5}, {opAllgather, 4, 0.75}, {opReduceScatter, 8, 0.875}, {opAlltoall, 4, 0.75},
		{opBroadcast, 8, 1}, {opReduce, 8, 1}, {opSendrecv, 2, 1},
	} {
		if got := busFactor(c.op, c.n); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("busFactor(%s, %d) = %v, want %v", c.op, c.n, got, c.want)
		}
	}
	if len(benchOps) != 7 {
		t.Fatalf("benchOps = %v", benchOps)
	}
	// 1 MB in 1 µs is 1000 GB/s; allreduce at 4 ranks moves 1.5× that.
	r := newResult(opAllreduce, 4, 1_000_000, 1, 0, false)
	if r.AlgBW != 1000 || r.BusBW != 1500 || r.Wrong != nil {
		t.Errorf("newResult = %+v", r)
	}
}

// TestOpCount: the split ops round the count down to a multiple of the
// world size, and a size too small for the world is skipped (0).
func TestOpCount(t *testing.T) {
	for _, c := range []struct {
		op          string
		bytes, n, c int
	}{
		{opAllreduce, 8, 4, 2}, {opAllgather, 8, 4, 0}, {opAllgather, 512, 3, 126}, {opReduceScatter, 4096, 3, 1023},
		{opAlltoall, 64, 2, 16}, {opBroadcast, 12, 8, 3},
	} {
		if got := opCount(c.op, c.bytes, c.n); got != c.c {
			t.Errorf("opCount(%s, %d, %d) = %d, want %d", c.op, c.bytes, c.n, got, c.c)
		}
	}
	if _, err := parseOps("allreduce,bogus"); err == nil || !strings.Contains(err.Error(), `"bogus"`) {
		t.Errorf("parseOps of a bad op: %v", err)
	}
	if ops, err := parseOps("all"); err != nil || !reflect.DeepEqual(ops, benchOps) {
		t.Errorf("parseOps(all) = %v, %v", ops, err)
	}
}

func wrongs(n int64) *int64 { return &n }

func testReport() *benchReport {
	ours := benchSeriesResult{Name: "cpupool", Rows: []benchRow{
		{Bytes: 8, Count: 2, Type: "float", Redop: "sum", Root: -1, IP: newResult(opAllreduce, 2, 8, 10, 0, true)},
		{Bytes: 1 << 20, Count: 1 << 18, Type: "float", Redop: "sum", Root: -1, IP: newResult(opAllreduce, 2, 1<<20, 500, 0, true)},
	}}
	gloo := benchSeriesResult{Name: "gloo", Rows: []benchRow{
		{Bytes: 8, Count: 2, Type: "float", Redop: "sum", Root: -1, IP: newResult(opAllreduce, 2, 8, 20, 0, true)},
	}}
	mpi := benchSeriesResult{Name: "openmpi", Rows: []benchRow{
		{Bytes: 8, Count: 2, Type: "float", Redop: "sum", Root: -1, OOP: newResult(opAllreduce, 2, 8, 4, 0, true), IP: newResult(opAllreduce, 2, 8, 5, 3, true)},
		{Bytes: 1 << 20, Count: 1 << 18, Type: "float", Redop: "sum", Root: -1, IP: newResult(opAllreduce, 2, 1<<20, 1000, 0, false)},
	}}
	return &benchReport{Op: opAllreduce, Backend: "cpupool", NProc: 2, Iters: 20, Warmup: 5, Check: true, Repeat: 1,
		Series: []benchSeriesResult{ours, gloo, mpi}}
}

// TestWriteTable: nccl-tests' columns, N/A for a mode not run, each
// peer's time and ratio beside ours, and the #wrong total.
func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	writeTable(&b, testReport())
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var rows [][]string
	for _, l := range lines {
		if !strings.HasPrefix(l, "#") {
			rows = append(rows, strings.Fields(l))
		}
	}
	if len(rows) != 2 {
		t.Fatalf("want 2 rows, got %d:\n%s", len(rows), out)
	}
	for _, h := range []string{"out-of-place", "in-place", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "gloo", "openmpi"} {
		if !strings.Contains(out, h) {
			t.Errorf("the header lacks %q:\n%s", h, out)
		}
	}
	// size count type redop root | oop: N/A×4 | ip: time algbw busbw #wrong | gloo oop x ip x | openmpi oop x ip x
	want := []string{"8", "2", "float", "sum", "-1", "N/A", "N/A", "N/A", "N/A", "10.00", "0.00", "0.00", "0",
		"-", "-", "20.00", "2.00", "4.00", "-", "5.00!", "0.50"}
	if !reflect.DeepEqual(rows[0], want) {
		t.Errorf("row 8 B:\n got %q\nwant %q", rows[0], want)
	}
	// 1 MiB in 500 µs: algbw 2.10 GB/s, busbw ×1 at 2 ranks; gloo has no row.
	want = []string{"1048576", "262144", "float", "sum", "-1", "N/A", "N/A", "N/A", "N/A", "500.00", "2.10", "2.10", "0",
		"-", "-", "-", "-", "-", "-", "1000.00", "2.00"}
	if !reflect.DeepEqual(rows[1], want) {
		t.Errorf("row 1 MiB:\n got %q\nwant %q", rows[1], want)
	}
	if !strings.Contains(out, "# #wrong (all series): 3\n") {
		t.Errorf("the #wrong total (the peer's 3) is missing:\n%s", out)
	}
}

// TestJSONRoundTrip: what --json writes, readJSON reads back unchanged;
// a file that is not one is refused with its name.
func TestJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "b.json")
	f := &benchFile{Date: "2026-12-01T12:00:00Z", Host: "h", Command: []string{"conftest", "bench"}, Note: "n",
		Reports: []benchReport{*testReport()}}
	f.Reports[0].Machine = []byte(`{"gpu":"H200"}`)
	if err := writeJSON(path, f); err != nil {
		t.Fatal(err)
	}
	got, err := readJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	// The machine section comes back re-indented: compare it compacted.
	var m bytes.Buffer
	if err := json.Compact(&m, got.Reports[0].Machine); err != nil || m.String() != `{"gpu":"H200"}` {
		t.Errorf("machine section %s (%v)", got.Reports[0].Machine, err)
	}
	got.Reports[0].Machine = f.Reports[0].Machine
	if !reflect.DeepEqual(got, f) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, f)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"reports": []}`), 0o644)
	if _, err := readJSON(bad); err == nil || !strings.Contains(err.Error(), "bad.json") {
		t.Errorf("readJSON of an empty file: %v", err)
	}
}

// TestBenchLines: the BENCH2 format round-trips, the older format maps
// to an in-place allreduce, and aggregate averages times over ranks and
// adds up the wrong elements.
func TestBenchLines(t *testing.T) {
	l0 := formatBenchLine("cpupool", opAllgather, 0, 64, 16, 10, 0, math.NaN(), -1)
	l1 := formatBenchLine("cpupool", opAllgather, 1, 64, 16, 30, 2, math.NaN(), -1)
	var samples []benchSample
	for _, l := range []string{l0, l1, "BENCH 8 3.50", "unrelated output"} {
		s, ok, err := parseBenchLine(l, "raw-ucc")
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			samples = append(samples, s)
		}
	}
	if len(samples) != 3 {
		t.Fatalf("parsed %d lines, want 3", len(samples))
	}
	if _, _, err := parseBenchLine("BENCH2 cpupool allreduce 0 8", ""); err == nil {
		t.Error("a short BENCH2 line parsed")
	}
	rows := aggregate(samples, 2)
	ag := rows[sampleKey{"cpupool", opAllgather, 64}]
	if ag.OOP == nil || ag.OOP.TimeUS != 20 || *ag.OOP.Wrong != 2 || ag.IP != nil || ag.Count != 16 || ag.Redop != "none" {
		t.Errorf("allgather row = %+v / %+v", ag, ag.OOP)
	}
	raw := rows[sampleKey{"raw-ucc", opAllreduce, 8}]
	if raw.IP == nil || raw.IP.TimeUS != 3.5 || raw.IP.Wrong != nil || raw.OOP != nil {
		t.Errorf("older-format row = %+v", raw)
	}
	// --repeat keeps the faster time and every wrong element.
	a := benchRow{OOP: &benchResult{TimeUS: 5, Wrong: wrongs(1)}}
	b := benchRow{OOP: &benchResult{TimeUS: 4, Wrong: wrongs(0)}, IP: &benchResult{TimeUS: 7}}
	if m := faster(a, b); m.OOP.TimeUS != 4 || *m.OOP.Wrong != 1 || m.IP.TimeUS != 7 {
		t.Errorf("faster = %+v %+v", m.OOP, m.IP)
	}
}

// corruptRunner runs the real op and then spoils one element of its
// output, as a broken backend would.
type corruptRunner struct{ benchRunner }

func (c corruptRunner) run(ctx context.Context, k *benchCase, iters int) error {
	if err := c.benchRunner.run(ctx, k, iters); err != nil {
		return err
	}
	unsafe.Slice((*float32)(k.out.HostPtr()), k.out.Numel())[0] += 1000
	return nil
}

// TestCheckCatchesWrongResults runs every op on two in-process cpupool
// ranks through measure, with the default window and with --depth 1 (the
// blocking forms): the checked result has no wrong element, and once the
// output is corrupted after the op, the check counts it.
func TestCheckCatchesWrongResults(t *testing.T) {
	const world = 2
	st := store.NewHashStore()
	pgs := testgroup.StartClosed(t, world, func(r int) (*dispatcher.ProcessGroup, error) {
		return dispatcher.Init(context.Background(), dispatcher.Config{Backend: "cpupool", Store: st, Rank: r, WorldSize: world, Timeout: 20 * time.Second})
	})
	errs := make([]error, world)
	var wg sync.WaitGroup
	const count = 1000
	for _, op := range benchOps {
		for _, tc := range []struct {
			inPlace, corrupt bool
			depth            int
		}{{false, false, 0}, {false, true, 0}, {true, false, 0}, {true, true, 0}, {false, false, 1}, {true, false, 1}, {true, true, 1}} {
			inPlace, corrupt, depth := tc.inPlace, tc.corrupt, tc.depth
			if !(&pgRunner{}).supports(op, inPlace, world) {
				continue
			}
			got := make([]int64, world)
			for r := range world {
				wg.Go(func() {
					ctx := context.Background()
					dev := &benchDevice{}
					var run benchRunner = &pgRunner{series: "cpupool", pg: pgs[r], dev: dev, depth: depth, blocking: true}
					if corrupt {
						run = corruptRunner{run}
					}
					var sends, recvs []*tensor.Tensor
					for range hostWindow(4 * count) {
						s, _ := dev.alloc(ctx, count)
						d, _ := dev.alloc(ctx, count)
						sends, recvs = append(sends, s), append(recvs, d)
					}
					c, err := newCases(op, sends, recvs, opCount(op, 4*count, world), r, world, inPlace)
					if err == nil {
						_, got[r], err = measure(ctx, pgs[r], dev, run, c, 10, 2, true)
					}
					errs[r] = err
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("%s %s, depth %d: %v", op, modeName(inPlace), depth, err)
			}
			want := []int64{0, 0}
			if corrupt {
				want = []int64{1, 1}
				if op == opReduce {
					want = []int64{1, 0} // only the root's output is defined
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s %s, depth %d, corrupted %v: wrong elements per rank %v, want %v", op, modeName(inPlace), depth, corrupt, got, want)
			}
		}
	}
}

// TestBenchCommand runs `conftest bench` for every op over two cpupool
// rank processes (this test binary, see TestMain) with -c 1 and --json,
// and, where mpicc is installed, Open MPI beside it.
func TestBenchCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	peers := "none"
	if _, err := exec.LookPath("mpicc"); err == nil {
		peers = mpiName
	}
	path := filepath.Join(t.TempDir(), "out.json")
	table := benchQuiet(t, []string{"--backend", "cpupool", "--op", "all", "-b", "8", "-e", "64K", "-f", "32", "--nproc", "2", "-c", "1",
		"-n", "3", "-w", "1", "--peers", peers, "--json", path})
	f, err := readJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Reports) != len(benchOps) {
		t.Fatalf("%d reports, want one per op", len(f.Reports))
	}
	for _, rep := range f.Reports {
		if rep.Series[0].Name != "cpupool" || len(rep.Series[0].Rows) != 4 { // 8 B, 256 B, 8 KiB, 64 KiB
			t.Errorf("%s: series %+v", rep.Op, rep.Series[0])
		}
		if peers != "none" && (len(rep.Series) != 2 || rep.Series[1].Name != mpiName || len(rep.Series[1].Rows) != 4) {
			t.Errorf("%s: no Open MPI rows: %+v", rep.Op, rep.Series)
		}
		for _, s := range rep.Series {
			for _, row := range s.Rows {
				for _, m := range []*benchResult{row.OOP, row.IP} {
					if m != nil && (m.Wrong == nil || *m.Wrong != 0 || m.TimeUS <= 0) {
						t.Errorf("%s %s %d B: %+v", rep.Op, s.Name, row.Bytes, m)
					}
				}
			}
		}
	}
	if n := strings.Count(table, "# #wrong (all series): 0\n"); n != len(benchOps) {
		t.Errorf("%d tables with #wrong 0, want %d:\n%s", n, len(benchOps), table)
	}
}

// TestPlot draws a file's reports into an SVG, which must parse as XML
// with an <svg> root and show the series names; at one rank a busbw plot
// of allreduce has nothing to draw and says to use algbw.
func TestPlot(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "b.json")
	if err := writeJSON(in, &benchFile{Reports: []benchReport{*testReport()}}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "p.svg")
	if err := benchPlot([]string{"-o", out, in}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b))
	var root string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not valid XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	for _, s := range []string{"cpupool allreduce n=2", "gloo", "openmpi", "busbw"} {
		if !bytes.Contains(b, []byte(s)) {
			t.Errorf("the SVG lacks %q", s)
		}
	}
	// FILE@series keeps those series; --op keeps that op's reports.
	if err := benchPlot([]string{"-o", out, "--op", opAllreduce, in + "@gloo"}); err != nil {
		t.Fatal(err)
	}
	if b, _ = os.ReadFile(out); bytes.Contains(b, []byte("openmpi")) || !bytes.Contains(b, []byte("gloo allreduce")) {
		t.Error("@gloo drew other series, or not gloo")
	}
	if err := benchPlot([]string{"-o", out, "--op", opAlltoall, in}); err == nil {
		t.Error("a plot of an op absent from the file succeeded")
	}
	one := testReport()
	one.NProc = 1
	for i := range one.Series {
		for j := range one.Series[i].Rows {
			row := &one.Series[i].Rows[j]
			for _, m := range []*benchResult{row.OOP, row.IP} {
				if m != nil {
					m.BusBW = 0
				}
			}
		}
	}
	writeJSON(in, &benchFile{Reports: []benchReport{*one}})
	if err := benchPlot([]string{"-o", out, in}); err == nil || !strings.Contains(err.Error(), "--metric algbw") {
		t.Errorf("busbw plot of world 1: %v", err)
	}
	if err := benchPlot([]string{"-o", out, "--metric", "algbw", in}); err != nil {
		t.Errorf("algbw plot of world 1: %v", err)
	}
}

// TestProgress: the progress line is drawn on a terminal (a pty here)
// and not on a pipe, and it counts rows of the total.
func TestProgress(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if isTerminal(w) {
		t.Error("a pipe counted as a terminal")
	}
	if ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0); err == nil {
		defer ptmx.Close()
		if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
			t.Fatal(err)
		}
		n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
		if err != nil {
			t.Fatal(err)
		}
		pts, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer pts.Close()
		if !isTerminal(pts) {
			t.Error("a pty is not a terminal")
		}
	} else {
		t.Logf("no pty to try (%v)", err)
	}
	series := []benchSeries{{name: "cpupool", also: []string{rawNCCLName}}, {name: "raw-ucc", ops: []string{opAllreduce}}}
	p := newProgress(series, []string{opAllreduce, opAllgather}, []int{8, 1024}, 4, 2)
	// (1 + 1 also) × 2 ops × 2 sizes (8 B allgather is too small for 4 ranks: 3 rows) × 2 repeats + raw-ucc 2 sizes × 2.
	if p.total != 2*3*2+2*2 {
		t.Errorf("total %d rows", p.total)
	}
	var b bytes.Buffer
	p.w = &b
	p.step(benchSample{series: "cpupool", op: opAllreduce, bytes: 8})
	if !strings.Contains(b.String(), "1 of 16 rows, cpupool allreduce 8 B") {
		t.Errorf("progress line %q", b.String())
	}
}

// TestBenchBadInput: bad flags fail before anything runs, naming the
// value.
func TestBenchBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--backend", "gloo"}, `"gloo"`},
		{[]string{"--op", "allreduce,scan"}, `"scan"`},
		{[]string{"-c", "2"}, "-c 2"},
		{[]string{"-b", "1M", "-e", "8"}, "-b 1M is above -e 8"},
		{[]string{"-e", "3"}, `"3"`},
		{[]string{"-f", "1"}, "-f 1"},
		{[]string{"--nproc", "2,x"}, `"x"`},
		{[]string{"--backend", "nccl", "--peers", "gloo"}, `"gloo" does not go with --backend nccl`},
		{[]string{"--peers", "raw-ucc"}, "raw-ucc needs --backend ucc"},
		{[]string{"--peers", "nccl-tests"}, `"nccl-tests"`},
		{[]string{"--peers", "cpupool"}, "that is the backend measured"},
		{[]string{"extra"}, `unknown bench subcommand "extra"`},
		{[]string{"--by-size"}, "--by-size needs --repeat 2 or more"},
		{[]string{"--pin", "0,a"}, `bad --pin entry "a"`},
		{[]string{"--pin", "1-"}, `bad --pin entry "1-"`},
	} {
		err := bench(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("bench %q: %v, want an error with %q", c.args, err, c.want)
		}
	}
}

// benchQuiet runs bench with args and returns what it printed, captured
// rather than printed; it fails the test, showing that, when bench fails.
func benchQuiet(t *testing.T, args []string) string {
	t.Helper()
	stdout := os.Stdout
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout = w
	var table bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&table, r); close(done) }()
	err = bench(args)
	w.Close()
	os.Stdout = stdout
	<-done
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, table.String())
	}
	return table.String()
}
