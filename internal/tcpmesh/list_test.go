package tcpmesh

import (
	"slices"
	"testing"
)

// TestFifo checks the queue that both matching maps use: FIFO order,
// removal at the head, middle and tail (a receive withdrawn by Cancel),
// and that the map helpers drop a key whose queue empties.
func TestFifo(t *testing.T) {
	rs := make([]*Req, 5)
	for i := range rs {
		rs[i] = &Req{tag: uint64(i)}
	}
	order := func(l *fifo[*Req]) []uint64 {
		var got []uint64
		for r := l.pop(); r != nil; r = l.pop() {
			got = append(got, r.tag)
			if r.next != nil {
				t.Fatalf("popped element %d still linked", r.tag)
			}
		}
		return got
	}
	var l fifo[*Req]
	for _, r := range rs {
		l.push(r)
	}
	l.remove(rs[0])         // head
	l.remove(rs[2])         // middle
	l.remove(rs[4])         // tail
	l.remove(&Req{tag: 99}) // absent: ignored
	l.push(rs[0])           // the tail moved back correctly
	if got, want := order(&l), []uint64{1, 3, 0}; !slices.Equal(got, want) {
		t.Fatalf("order after removals: got %v, want %v", got, want)
	}
	if !l.empty() || l.tail != nil {
		t.Fatalf("drained queue not empty: %+v", l)
	}

	mp := map[key]fifo[*msg]{}
	k := key{1, 7}
	if popFrom(mp, k) != nil {
		t.Fatal("pop of a missing key returned a message")
	}
	a, b := &msg{seq: 1}, &msg{seq: 2}
	pushTo(mp, k, a)
	pushTo(mp, k, b)
	if got := popFrom(mp, k); got != a {
		t.Fatalf("first pop: got seq %d, want 1", got.seq)
	}
	if _, ok := mp[k]; !ok {
		t.Fatal("key deleted while its queue still held a message")
	}
	removeFrom(mp, k, b)
	if _, ok := mp[k]; ok {
		t.Fatal("key kept after its queue emptied")
	}
}
