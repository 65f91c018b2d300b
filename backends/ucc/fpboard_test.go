package ucc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/internal/opcheck"
	"github.com/gocoll/gocoll/internal/shm"
	"github.com/gocoll/gocoll/internal/tcpmesh"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// heapGroup is n ranks' views of one board in this process's memory: the
// unit tests' stand-in for the /dev/shm file (the same code reads and
// writes it).
func heapGroup(n int) []*shmBoard {
	r := heapRings(n, fpSlots)
	bs := make([]*shmBoard, n)
	for p := range bs {
		bs[p] = &shmBoard{r: r, rank: p}
	}
	return bs
}

func slotFor(op backend.Op, dt tensor.DType, r *backend.ReduceOp, count, root int) fpSlot {
	return fpSlot{fp: opcheck.Of(op, dt, r, count), root: int32(root)}
}

// verdicts posts every rank's slot of seq and returns what each rank's
// judge says.
func verdicts(t *testing.T, bs []*shmBoard, seq uint64, slots []fpSlot) []fpVerdict {
	t.Helper()
	for p, b := range bs {
		if !b.post(seq, slots[p]) {
			t.Fatalf("rank %d: no room for %d", p, seq)
		}
	}
	out := make([]fpVerdict, len(bs))
	for p, b := range bs {
		v, done := judge(b, p, len(bs), seq, slots[p])
		if !done {
			t.Fatalf("rank %d: not done with every slot posted", p)
		}
		out[p] = v
	}
	return out
}

// TestJudge: every rank reaches the same verdict in the same words (the
// lowest rank at odds with rank 0),
// and none before every peer's fingerprint is there.
func TestJudge(t *testing.T) {
	sum, maxOp := backend.SUM, backend.MAX
	f32 := slotFor(backend.OpAllreduce, tensor.Float32, &sum, 1024, -1)
	for _, tc := range []struct {
		name   string
		slots  []fpSlot
		detail string
		ranks  []int
		kind   error
	}{
		{"agree", []fpSlot{f32, f32, f32}, "", nil, nil},
		{"dtype", []fpSlot{f32, slotFor(backend.OpAllreduce, tensor.Int32, &sum, 1024, -1)},
			"the ranks passed different collectives: rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce int32 x 1024 (SUM)", []int{0, 1}, backend.ErrInvalidArgument},
		{"count, rank 2 of 3", []fpSlot{f32, f32, slotFor(backend.OpAllreduce, tensor.Float32, &sum, 1000, -1)},
			"the ranks passed different collectives: rank 0 allreduce float32 x 1024 (SUM), rank 2 allreduce float32 x 1000 (SUM)", []int{0, 2}, backend.ErrInvalidArgument},
		{"reduce op", []fpSlot{f32, slotFor(backend.OpAllreduce, tensor.Float32, &maxOp, 1024, -1)},
			"the ranks passed different collectives: rank 0 allreduce float32 x 1024 (SUM), rank 1 allreduce float32 x 1024 (MAX)", []int{0, 1}, backend.ErrInvalidArgument},
		{"op", []fpSlot{f32, slotFor(backend.OpBroadcast, tensor.Float32, nil, 1024, 0)},
			"the ranks passed different collectives: rank 0 allreduce float32 x 1024 (SUM), rank 1 broadcast float32 x 1024", []int{0, 1}, backend.ErrInvalidArgument},
		{"root", []fpSlot{slotFor(backend.OpBroadcast, tensor.Float32, nil, 4, 0), slotFor(backend.OpBroadcast, tensor.Float32, nil, 4, 1)},
			"the ranks passed different roots: rank 0 broadcast float32 x 4 from root 0, rank 1 the same from root 1", []int{0, 1}, backend.ErrInvalidArgument},
		{"alltoall counts are not compared", []fpSlot{slotFor(backend.OpAlltoall, tensor.Float32, nil, -1, -1), slotFor(backend.OpAlltoall, tensor.Float32, nil, -1, -1)}, "", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := heapGroup(len(tc.slots))
			for p, b := range bs {
				if _, done := judge(b, p, len(bs), 0, tc.slots[p]); done {
					t.Fatalf("rank %d: done before any peer posted", p)
				}
			}
			for p, v := range verdicts(t, bs, 0, tc.slots) {
				if v.detail != tc.detail || !reflect.DeepEqual(v.ranks, tc.ranks) || v.kind != tc.kind {
					t.Errorf("rank %d: verdict %v %q %v, want %v %q %v", p, v.kind, v.detail, v.ranks, tc.kind, tc.detail, tc.ranks)
				}
			}
		})
	}
}

// TestSlotRoundTrip: a slot's words carry every field, negative roots and
// tcpmesh.AnyCount included, in memory and on the wire.
func TestSlotRoundTrip(t *testing.T) {
	sum := backend.AVG
	for _, s := range []fpSlot{
		slotFor(backend.OpReduce, tensor.BFloat16, &sum, 1<<40, 7),
		slotFor(backend.OpAlltoallBase, tensor.Int64, nil, -1, -1),
		{fp: opcheck.Of(backend.OpBarrier, 0, nil, 0), root: -1},
	} {
		if got := slotOf(s.words()); got != s {
			t.Errorf("words: %+v came back %+v", s, got)
		}
		var buf [fpSlotSize]byte
		encodeSlot(buf[:], s)
		if got := decodeSlot(buf[:]); got != s {
			t.Errorf("wire: %+v came back %+v", s, got)
		}
	}
}

// TestFlowControl: a rank may run fpSlots numbers ahead of the slowest
// peer's check and no further, and a missing peer is named.
func TestFlowControl(t *testing.T) {
	bs := heapGroup(3)
	s := slotFor(backend.OpBarrier, 0, nil, 0, -1)
	for seq := range uint64(fpSlots) {
		if !bs[0].post(seq, s) {
			t.Fatalf("no room for %d with nothing checked", seq)
		}
	}
	if bs[0].post(fpSlots, s) {
		t.Fatalf("room for %d before any peer checked 0: slot 0 would be overwritten unread", fpSlots)
	}
	bs[1].checked(1)
	if bs[0].post(fpSlots, s) {
		t.Fatalf("room for %d while rank 2 has not checked 0", fpSlots)
	}
	bs[2].checked(1)
	if !bs[0].post(fpSlots, s) {
		t.Fatalf("no room for %d once both peers checked 0", fpSlots)
	}
	if _, ok := bs[1].peek(0, 0); ok {
		t.Fatalf("slot of 0 still reads as 0 after %d overwrote it", fpSlots)
	}
	if _, ok := bs[1].peek(0, fpSlots); !ok {
		t.Fatalf("slot of %d not there", fpSlots)
	}
	bs[1].post(0, s)
	if ranks, _ := missing(bs[0], 0, 3, 0); !reflect.DeepEqual(ranks, []int{2}) {
		t.Fatalf("missing = %v, want [2]", ranks)
	}
}

// TestShmBoardFile: the board in a real /dev/shm file: rank 0 makes it,
// the others map it, a slot written by one is read by the others, the
// file's name is gone once unlinked, and a peer whose process has exited
// is reported gone, naming it.
func TestShmBoardFile(t *testing.T) {
	const n = 3
	b0, path, err := createShmBoard(n)
	if err != nil {
		t.Skipf("no shared memory here: %v", err)
	}
	bs := []*shmBoard{b0}
	for r := 1; r < n; r++ {
		b, err := openShmBoard(path, r, n)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	if _, err := openShmBoard(path, 1, n+1); err == nil {
		t.Fatalf("a board of %d ranks opened as one of %d", n, n+1)
	}
	if err := shm.Unlink(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s still there after unlink: %v", path, err)
	}
	for _, b := range bs {
		b.register()
	}
	// Rank 2's process id is that of a child process, which exits later.
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot run a child process: %v", err)
	}
	bs[2].r.pid(2).Store(uint64(cmd.Process.Pid))
	for _, b := range bs {
		b.learnPids()
	}
	if _, err := bs[0].gone(2); err != nil {
		t.Fatalf("a live peer reported gone: %v", err)
	}
	// Killed and not yet reaped (a zombie), then reaped: gone either way.
	_ = cmd.Process.Kill()
	for deadline := time.Now().Add(5 * time.Second); !exited(cmd.Process.Pid) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if r, err := bs[0].gone(2); err == nil || r != 2 {
		t.Fatalf("gone(2) of a zombie = %d, %v, want an error naming rank 2", r, err)
	}
	_ = cmd.Wait()
	s := slotFor(backend.OpAllreduce, tensor.Float32, nil, 8, -1)
	bs[1].post(5, s)
	if got, ok := bs[0].peek(1, 5); !ok || got != s {
		t.Fatalf("rank 0 reads %+v %v of rank 1's slot 5, want %+v", got, ok, s)
	}
	if _, err := bs[0].gone(1); err != nil {
		t.Fatalf("a live peer reported gone: %v", err)
	}
	if r, err := bs[0].gone(2); err == nil || r != 2 || !strings.Contains(err.Error(), "rank 2") {
		t.Fatalf("gone(2) = %d, %v, want an error naming rank 2", r, err)
	}
	for _, b := range bs {
		if err := b.close(); err != nil {
			t.Fatal(err)
		}
	}
	left, _ := filepath.Glob(filepath.Join(shm.Dir, "gocoll-ucc-fp-*"))
	for _, f := range left {
		if f == path {
			t.Fatalf("%s left in %s", f, shm.Dir)
		}
	}
}

// TestTCPBoard: the side channel carries every rank's slots to its peers
// over real TCP, holds a peer back while this rank's ring is full of
// unchecked numbers, and names a peer whose channel broke.
func TestTCPBoard(t *testing.T) {
	const n = 3
	st := store.NewHashStore()
	bs := make([]*tcpBoard, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ps, _ := store.NewPrefixStore("fp", st)
			bs[r], errs[r] = newTCPBoard(context.Background(), ps, r, n, "127.0.0.1", 10*time.Second, 10*time.Second)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	sum := backend.SUM
	for seq := range uint64(fpSlots + 10) {
		for r, b := range bs {
			b.post(seq, slotFor(backend.OpAllreduce, tensor.Float32, &sum, int(seq), r))
		}
	}
	wait := func(b *tcpBoard, peer int, seq uint64) (fpSlot, bool) {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if s, ok := b.peek(peer, seq); ok {
				return s, true
			}
		}
		return fpSlot{}, false
	}
	for r, b := range bs {
		for p := range n {
			if p == r {
				continue
			}
			if s, ok := wait(b, p, 3); !ok || s.fp.Count != 3 || s.root != int32(p) {
				t.Fatalf("rank %d: rank %d's slot of 3: %+v %v", r, p, s, ok)
			}
		}
	}
	// Nothing checked yet: the ring holds fpSlots numbers, the rest waits.
	time.Sleep(50 * time.Millisecond)
	if _, ok := bs[0].peek(1, fpSlots); ok {
		t.Fatalf("number %d received before 0 was checked", fpSlots)
	}
	bs[0].checked(20)
	if s, ok := wait(bs[0], 1, fpSlots+5); !ok || s.fp.Count != fpSlots+5 {
		t.Fatalf("number %d not received once 20 were checked: %+v %v", fpSlots+5, s, ok)
	}
	// Rank 2 goes: its peers' receives fail, naming it.
	_ = bs[2].mesh.Close()
	for r := range 2 {
		var err error
		blame := -1
		for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			bs[r].checked(fpSlots + 10) // let the receivers reach the end
			blame, err = bs[r].gone(2)
		}
		if err == nil || blame != 2 || !strings.Contains(err.Error(), "rank 2") {
			t.Fatalf("rank %d: gone(2) = %d, %v, want an error blaming rank 2", r, blame, err)
		}
		if _, err := bs[r].gone(1 - r); err != nil {
			t.Fatalf("rank %d: a live peer reported gone: %v", r, err)
		}
	}
	// A broken connection fails every receive of the mesh, naming the
	// rank whose connection broke: that rank is blamed for each peer.
	bs[0].fail(1, &tcpmesh.PeerError{Rank: 2, Err: errors.New("connection reset by peer")})
	if blame, err := bs[0].gone(1); blame != 2 || err == nil {
		t.Fatalf("gone(1) after rank 2's connection broke = %d, %v, want rank 2 blamed", blame, err)
	}
	for _, b := range bs {
		_ = b.close()
	}
}
