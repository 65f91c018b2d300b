package store

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"testing"
)

// The tests below drive serverState directly, without a socket or the
// parser: each op is called on sessions, and the replies queued on them and
// the state left behind are checked.

func newTestState() *serverState {
	o := ServerOptions{MaxValueLen: 16, MaxRequestBytes: 64}
	return newServerState(&o)
}

// take returns the replies queued on s and clears them.
func take(s *session) []byte {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	b := s.out
	s.out = nil
	return b
}

// wantReply checks the replies queued on s, then clears them.
func wantReply(t *testing.T, s *session, want []byte) {
	t.Helper()
	if got := take(s); !bytes.Equal(got, want) {
		t.Fatalf("reply %q, want %q", got, want)
	}
}

func str(v string) []byte { return appendStr(nil, v) }

func keysOf(ks ...string) [][]byte {
	out := make([][]byte, len(ks))
	for i, k := range ks {
		out[i] = []byte(k)
	}
	return out
}

// wantWoken checks that wake is exactly the sessions want, in order.
func wantWoken(t *testing.T, wake []*session, want ...*session) {
	t.Helper()
	if !slices.Equal(wake, want) {
		t.Fatalf("woke %d sessions %p, want %d %p", len(wake), wake, len(want), want)
	}
}

// wantNoWaits checks that no wait is left on the state or on the sessions.
func wantNoWaits(t *testing.T, st *serverState, ss ...*session) {
	t.Helper()
	if len(st.waiters) != 0 {
		t.Fatalf("%d keys still have waiters", len(st.waiters))
	}
	for _, s := range ss {
		if len(s.waits) != 0 {
			t.Fatalf("session still has %d waits", len(s.waits))
		}
	}
}

func TestStateSetGet(t *testing.T) {
	st, s := newTestState(), &session{}
	in := []byte("abc")
	wantWoken(t, st.set([]byte("k"), in))
	in[0] = 'X' // the state keeps a copy
	if !getOK(st, s, "k", false) {
		t.Fatal("get of a set key reports it missing")
	}
	wantReply(t, s, str("abc"))

	// A set of the same length overwrites in place; a reply already queued
	// is a copy and does not change with it.
	getOK(st, s, "k", false)
	st.set([]byte("k"), []byte("xyz"))
	st.set([]byte("k"), []byte("longer"))
	wantReply(t, s, str("abc"))
	if got := string(st.kv["k"]); got != "longer" {
		t.Fatalf("stored %q, want longer", got)
	}

	// A missing key: no reply in DialectV1 (the connection closes), an
	// empty value in DialectV2.
	if getOK(st, s, "none", false) {
		t.Fatal("get of a missing key reports it present")
	}
	wantReply(t, s, nil)
	if getOK(st, s, "none", true) {
		t.Fatal("get of a missing key reports it present")
	}
	wantReply(t, s, str(""))
}

func TestStateAdd(t *testing.T) {
	st, s := newTestState(), &session{}
	for _, tc := range []struct {
		delta, want int64
	}{{5, 5}, {7, 12}, {-20, -8}} {
		if _, err := st.add(s, []byte("n"), tc.delta); err != nil {
			t.Fatal(err)
		}
		wantReply(t, s, i64(tc.want))
		if got := string(st.kv["n"]); got != strconv.FormatInt(tc.want, 10) {
			t.Fatalf("stored %q, want %d", got, tc.want)
		}
	}
	// It parses as std::stoll does, and wraps as the C++ server does.
	st.set([]byte("p"), []byte(" +41tail"))
	if _, err := st.add(s, []byte("p"), 1); err != nil {
		t.Fatal(err)
	}
	wantReply(t, s, i64(42))
	st.set([]byte("max"), []byte(strconv.FormatInt(math.MaxInt64, 10)))
	if _, err := st.add(s, []byte("max"), 1); err != nil {
		t.Fatal(err)
	}
	wantReply(t, s, i64(math.MinInt64))
	// Not a number: an error, no reply, nothing changed.
	st.set([]byte("s"), []byte("abc"))
	if _, err := st.add(s, []byte("s"), 1); !isMalformed(err) {
		t.Fatalf("ADD to a non-number: %v, want errMalformed", err)
	}
	wantReply(t, s, nil)
	if got := string(st.kv["s"]); got != "abc" {
		t.Fatalf("a failed ADD changed the value to %q", got)
	}
}

func TestStateCompareSet(t *testing.T) {
	for _, tc := range []struct {
		name          string
		cur           *string // nil: missing
		exp, des      string
		reply, stored string
		missing       bool // the key stays missing
	}{
		{name: "missing, expected empty: set", exp: "", des: "d", reply: "d", stored: "d"},
		{name: "missing, expected not empty: the expected value", exp: "e", des: "d", reply: "e", missing: true},
		{name: "equal: set", cur: ptr("e"), exp: "e", des: "d", reply: "d", stored: "d"},
		{name: "different: the current value", cur: ptr("c"), exp: "e", des: "d", reply: "c", stored: "c"},
		{name: "present and empty, expected empty: set", cur: ptr(""), exp: "", des: "d", reply: "d", stored: "d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, s, w := newTestState(), &session{}, &session{}
			if tc.cur != nil {
				st.set([]byte("k"), []byte(*tc.cur))
			}
			st.wait(w, keysOf("k2"))
			wake, _ := st.compareSet(s, "k", []byte(tc.exp), []byte(tc.des))
			wantReply(t, s, str(tc.reply))
			v, ok := st.kv["k"]
			if ok == tc.missing || string(v) != tc.stored {
				t.Fatalf("stored %q (present %v), want %q (present %v)", v, ok, tc.stored, !tc.missing)
			}
			wantWoken(t, wake) // a wait on another key is not disturbed
			if len(st.waiters["k2"]) != 1 {
				t.Fatal("the wait on another key was dropped")
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestStateWaitWake(t *testing.T) {
	st, a, b, setter := newTestState(), &session{}, &session{}, &session{}
	st.set([]byte("x"), []byte("1"))

	// Every key present: STOP_WAITING at once, nothing registered.
	st.wait(a, keysOf("x"))
	wantReply(t, a, []byte{replyStopWait})
	wantNoWaits(t, st, a)

	// a waits for x (present), y and z; b for z only.
	st.wait(a, keysOf("x", "y", "z"))
	st.wait(b, keysOf("z"))
	wantReply(t, a, nil)
	if len(a.waits) != 1 || len(st.waiters["y"]) != 1 || len(st.waiters["z"]) != 2 {
		t.Fatalf("waits %d, waiters y %d z %d", len(a.waits), len(st.waiters["y"]), len(st.waiters["z"]))
	}
	wantWoken(t, st.set([]byte("y"), []byte("1")))
	wantReply(t, a, nil)
	wantWoken(t, st.set([]byte("z"), []byte("1")), a, b)
	wantReply(t, a, []byte{replyStopWait})
	wantReply(t, b, []byte{replyStopWait})
	wantReply(t, setter, nil)
	wantNoWaits(t, st, a, b)

	// ADD, APPEND, MULTI_SET and QUEUE_PUSH wake too; MULTI_SET wakes a
	// session waiting on two of its keys once.
	st.wait(a, keysOf("n"))
	wake, err := st.add(setter, []byte("n"), 1)
	if err != nil {
		t.Fatal(err)
	}
	wantWoken(t, wake, a)
	st.wait(a, keysOf("ap"))
	if wake, err = st.appendValue("ap", []byte("v")); err != nil {
		t.Fatal(err)
	}
	wantWoken(t, wake, a)
	st.wait(a, keysOf("m1", "m2"))
	wantWoken(t, st.multiSet([]string{"m1", "m2"}, [][]byte{[]byte("1"), []byte("2")}), a)
	st.wait(a, keysOf("q"))
	wantWoken(t, st.queuePush("q", []byte("v")), a)
	wantReply(t, a, bytes.Repeat([]byte{replyStopWait}, 4))
	wantNoWaits(t, st, a)
}

func TestStateCancelAndDrop(t *testing.T) {
	st, a, b := newTestState(), &session{}, &session{}
	st.wait(a, keysOf("x", "y"))
	st.wait(a, keysOf("x"))
	st.wait(b, keysOf("x"))
	st.cancelWait(a)
	wantReply(t, a, []byte{replyWaitCancel})
	if len(a.waits) != 0 || len(st.waiters["x"]) != 1 || st.waiters["y"] != nil {
		t.Fatalf("after CANCEL_WAIT: a has %d waits, x has %d waiters, y %d", len(a.waits), len(st.waiters["x"]), len(st.waiters["y"]))
	}
	// A session that ends loses its waits, and a write no longer wakes it.
	st.wait(a, keysOf("z"))
	st.drop(b)
	st.drop(a)
	wantNoWaits(t, st, a, b)
	wantWoken(t, st.set([]byte("x"), []byte("1")))
	wantWoken(t, st.set([]byte("z"), []byte("1")))
	wantReply(t, a, nil)
	wantReply(t, b, nil)
	// A request that was parsed as the connection ended is not answered.
	st.wait(a, keysOf("late"))
	wantWoken(t, st.set([]byte("late"), []byte("1")))
	wantReply(t, a, nil)
}

func TestStateCheck(t *testing.T) {
	st, s := newTestState(), &session{}
	st.set([]byte("a"), nil)
	st.queuePush("q", []byte("v"))
	for _, tc := range []struct {
		keys []string
		want byte
	}{
		{[]string{"a"}, replyReady},
		{[]string{"a", "q"}, replyReady}, // a non-empty queue counts
		{[]string{"a", "b"}, replyNotReady},
		{nil, replyReady},
	} {
		st.check(s, keysOf(tc.keys...))
		wantReply(t, s, []byte{tc.want})
	}
	st.queuePop(s, "q")
	take(s)
	st.check(s, keysOf("q")) // an emptied queue does not
	wantReply(t, s, []byte{replyNotReady})
}

func TestStateDeleteNumKeysListKeys(t *testing.T) {
	st, s := newTestState(), &session{}
	st.set([]byte("a"), []byte("1"))
	st.set([]byte("b"), []byte("2"))
	st.queuePush("q", []byte("v")) // queues are not keys
	st.numKeys(s)
	wantReply(t, s, i64(2))
	st.listKeys(s)
	if got := parseListKeys(t, take(s)); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("LIST_KEYS %q", got)
	}
	st.deleteKey(s, []byte("a"))
	wantReply(t, s, i64(1))
	st.deleteKey(s, []byte("a"))
	wantReply(t, s, i64(0))
	st.numKeys(s)
	wantReply(t, s, i64(1))
	if _, ok := st.kv["a"]; ok {
		t.Fatal("a deleted key is still stored")
	}
}

func TestStateAppend(t *testing.T) {
	st := newTestState() // MaxValueLen 16
	for _, v := range []string{"abc", "def"} {
		if _, err := st.appendValue("k", []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if got := string(st.kv["k"]); got != "abcdef" {
		t.Fatalf("stored %q", got)
	}
	if _, err := st.appendValue("k", []byte("0123456789a")); !isMalformed(err) {
		t.Fatalf("APPEND over the value limit: %v, want errMalformed", err)
	}
	if got := string(st.kv["k"]); got != "abcdef" {
		t.Fatalf("a refused APPEND changed the value to %q", got)
	}
	if _, err := st.appendValue("k", []byte("0123456789")); err != nil {
		t.Fatalf("APPEND up to the limit: %v", err)
	}
}

func TestStateMultiGetSet(t *testing.T) {
	st, s := newTestState() /* MaxRequestBytes 64 */, &session{}
	st.multiSet([]string{"a", "b", "a"}, [][]byte{[]byte("1"), []byte("22"), []byte("3")})
	if err := st.multiGet(s, keysOf("b", "none", "a")); err != nil {
		t.Fatal(err)
	}
	want := appendStr(appendStr(str("22"), ""), "3") // later keys win; missing is empty
	wantReply(t, s, want)
	// 8+2 bytes per "b": six fit in 64 bytes, seven do not, and then
	// nothing is replied.
	if err := st.multiGet(s, keysOf("b", "b", "b", "b", "b", "b")); err != nil {
		t.Fatal(err)
	}
	take(s)
	if err := st.multiGet(s, keysOf("b", "b", "b", "b", "b", "b", "b")); !isMalformed(err) {
		t.Fatalf("MULTI_GET over the reply limit: %v, want errMalformed", err)
	}
	wantReply(t, s, nil)
}

func TestStateQueues(t *testing.T) {
	st, s, a, b := newTestState(), &session{}, &session{}, &session{}
	st.queuePop(s, "q")
	wantReply(t, s, i64(0))
	// Two blocked pops wait on the queue: each push wakes only the oldest.
	st.wait(a, keysOf("q"))
	st.wait(b, keysOf("q"))
	wantWoken(t, st.queuePush("q", []byte("v1")), a)
	wantWoken(t, st.queuePush("q", []byte("v2")), b)
	wantWoken(t, st.queuePush("q", []byte("v3")))
	wantNoWaits(t, st, a, b)
	st.queueLen(s, "q")
	wantReply(t, s, i64(3))
	for i, v := range []string{"v1", "v2", "v3"} {
		st.queuePop(s, "q")
		wantReply(t, s, appendStr(i64(int64(3-i)), v)) // the length before the pop, then the head
	}
	st.queueLen(s, "q")
	wantReply(t, s, i64(0))
	if _, ok := st.queues["q"]; ok {
		t.Fatal("an emptied queue is still stored")
	}
}

// TestHandlersCoverEveryOp checks that every op of either dialect has a
// handler, so that a new op cannot fall through to "unknown code".
func TestHandlersCoverEveryOp(t *testing.T) {
	for _, tab := range [][]op{v2Codes[:], v1Codes[:]} {
		for code, o := range tab {
			if int(o) >= len(handlers) || handlers[o] == nil {
				t.Errorf("code %d (%s) has no handler", code, o)
			}
		}
	}
	if handlers[opInvalid] != nil {
		t.Error("opInvalid has a handler")
	}
}

// getOK runs GET on a state without a budget, where it cannot fail.
func getOK(st *serverState, s *session, k string, replyMissing bool) bool {
	ok, _ := st.get(s, []byte(k), replyMissing)
	return ok
}
