package store

import (
	"bytes"
	"strconv"
	"testing"
)

// FuzzServerState drives the server state machine (server_state.go)
// directly with a sequence of operations decoded from the input, over three
// sessions and four keys, and checks every reply against a model of the
// store: values, counters, CHECK, WAIT (at once, later, or refused past
// the per-session cap), CANCEL_WAIT, DELETE_KEY, MULTI_SET and sessions
// that end. After each step it checks the state's own invariants: the
// pending-wait index, the per-session key counts, and the memory budget's
// accounting of queued replies.
func FuzzServerState(f *testing.F) {
	f.Add([]byte{4, 0, 0, 0, 0, 1, 0, 9})
	f.Add([]byte{4, 0, 1, 4, 1, 1, 5, 0, 0, 0, 1, 1})
	f.Add([]byte{4, 0, 2, 7, 0, 0, 0, 2, 0, 4, 2, 2, 8, 1, 2})
	f.Add([]byte{2, 0, 0, 3, 0, 1, 0, 5, 2, 0, 0, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		const nsess, nkeys, waitCap = 3, 4, 3
		o := ServerOptions{MaxValueLen: 64, MaxRequestBytes: 1 << 10, MaxWaitKeysPerConn: waitCap}
		st := newServerState(&o)
		st.budget = newMemBudget(1 << 20)
		keys := [nkeys]string{"k0", "k1", "k2", "k3"}
		// A pending wait: the key indexes not yet written (with repeats),
		// and how many it named missing, which the cap counts until it ends.
		type mwait struct {
			missing []int
			named   int
		}
		var (
			sess  [nsess]*session
			model = map[string][]byte{}
			waits [nsess][]*mwait
		)
		for i := range sess {
			sess[i] = &session{budget: st.budget}
		}
		want := make([][]byte, nsess)
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		written := func(k int) {
			for i := range waits {
				kept := waits[i][:0]
				for _, w := range waits[i] {
					rest := w.missing[:0]
					for _, m := range w.missing {
						if m != k {
							rest = append(rest, m)
						}
					}
					w.missing = rest
					if len(rest) == 0 {
						want[i] = append(want[i], replyStopWait)
					} else {
						kept = append(kept, w)
					}
				}
				waits[i] = kept
			}
		}
		for len(data) > 0 {
			opc, si := next()%9, next()%nsess
			s := sess[si]
			k := next() % nkeys
			key := keys[k]
			switch opc {
			case 0: // SET
				v := []byte{byte(next())}
				st.set([]byte(key), v)
				model[key] = bytes.Clone(v)
				written(k)
			case 1: // GET (DialectV2: a missing key gets an empty reply)
				if _, err := st.get(s, []byte(key), true); err != nil {
					t.Fatal(err)
				}
				want[si] = appendStr(want[si], model[key])
			case 2: // ADD
				d := int64(next()) - 128
				cur, ok := model[key]
				n, perr := parseStoll(cur)
				_, err := st.add(s, []byte(key), d)
				switch {
				case ok && perr != nil:
					if err == nil {
						t.Fatalf("ADD to %q holding %q succeeded", key, cur)
					}
				case err != nil:
					t.Fatalf("ADD: %v", err)
				default:
					n += d
					model[key] = []byte(strconv.FormatInt(n, 10))
					written(k) // the wake-ups are queued before the reply
					want[si] = appendI64(want[si], n)
				}
			case 3, 4: // CHECK, WAIT of one or two keys
				ks := []int{k}
				if next()%2 == 1 {
					ks = append(ks, next()%nkeys)
				}
				kb := make([][]byte, len(ks))
				var missing []int
				for i, x := range ks {
					kb[i] = []byte(keys[x])
					if _, ok := model[keys[x]]; !ok {
						missing = append(missing, x)
					}
				}
				if opc == 3 {
					st.check(s, kb)
					r := replyReady
					if len(missing) > 0 {
						r = replyNotReady
					}
					want[si] = append(want[si], r)
					break
				}
				pending := 0
				for _, w := range waits[si] {
					pending += w.named
				}
				err := st.wait(s, kb)
				switch {
				case len(missing) == 0:
					want[si] = append(want[si], replyStopWait)
				case pending+len(missing) > waitCap:
					if err == nil {
						t.Fatalf("a WAIT past the cap (%d pending + %d) was taken", pending, len(missing))
					}
					want[si] = append(want[si], replyWaitCancel)
				default:
					if err != nil {
						t.Fatal(err)
					}
					waits[si] = append(waits[si], &mwait{missing: missing, named: len(missing)})
				}
			case 5: // CANCEL_WAIT
				st.cancelWait(s)
				waits[si] = nil
				want[si] = append(want[si], replyWaitCancel)
			case 6: // DELETE_KEY
				st.deleteKey(s, []byte(key))
				r := int64(0)
				if _, ok := model[key]; ok {
					r = 1
				}
				delete(model, key)
				want[si] = appendI64(want[si], r)
			case 7: // MULTI_SET of two keys
				k2 := next() % nkeys
				v := []byte{byte(next())}
				// Each value its own slice, as the parser makes them: the
				// state keeps them and later SETs overwrite in place.
				st.multiSet([]string{key, keys[k2]}, [][]byte{v, bytes.Clone(v)})
				model[key], model[keys[k2]] = bytes.Clone(v), bytes.Clone(v)
				written(k)
				written(k2)
			case 8: // the session ends; a new one takes its place
				st.drop(s)
				s.releaseAll()
				if s.Used() != 0 {
					t.Fatal("a dropped session still holds budget")
				}
				sess[si] = &session{budget: st.budget}
				waits[si], want[si] = nil, nil
				take(s)
			}
			// Replies, then the invariants.
			total := 0
			for i, s := range sess {
				s.outMu.Lock()
				if int(s.charged.Load()) != len(s.out) {
					t.Fatalf("session %d: %d reply bytes queued, %d charged", i, len(s.out), s.charged.Load())
				}
				total += int(s.charged.Load())
				s.outMu.Unlock()
				if got := take(s); !bytes.Equal(got, want[i]) {
					t.Fatalf("session %d: replies %x, want %x", i, got, want[i])
				}
				s.outMu.Lock()
				s.sentLocked(int(s.charged.Load()))
				s.outMu.Unlock()
				want[i] = want[i][:0]
			}
			if st.budget.Used() != 0 {
				t.Fatalf("budget holds %d bytes after every reply was sent (%d queued this step)", st.budget.Used(), total)
			}
			checkWaitIndex(t, st, sess[:])
		}
	})
}

// Used is the bytes a session holds against its budget.
func (s *session) Used() int {
	return int(s.charged.Load())
}

// checkWaitIndex checks that each session's pending waits know their
// places, that their key counts add up, that every pending wait is in the
// lists of the keys it still waits for, and that no list is mostly dead.
func checkWaitIndex(t *testing.T, st *serverState, ss []*session) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, s := range ss {
		n := 0
		for j, wr := range s.waits {
			if wr.idx != j || wr.done || wr.s != s {
				t.Fatalf("session %d: wait %d has index %d, done %v", i, j, wr.idx, wr.done)
			}
			n += len(wr.keys)
			// It is in the lists of the keys still to come, once for
			// each time it names them: remaining entries in all.
			seen, in := map[string]bool{}, 0
			for _, k := range wr.keys {
				if seen[k] {
					continue
				}
				seen[k] = true
				for _, x := range st.waiters[k] {
					if x == wr {
						in++
					}
				}
			}
			if in != wr.remaining {
				t.Fatalf("session %d: a pending wait is in its keys' lists %d times, with %d keys to come", i, in, wr.remaining)
			}
		}
		if n != s.waitKeys {
			t.Fatalf("session %d: waitKeys %d, the waits hold %d", i, s.waitKeys, n)
		}
	}
	for k, list := range st.waiters {
		dead := 0
		for _, x := range list {
			if x.done {
				dead++
			}
		}
		if dead > 0 && 2*dead > len(list)+1 {
			t.Fatalf("key %q: %d of %d waiters dead, not compacted", k, dead, len(list))
		}
	}
}
