package watch

import (
	"slices"
	"testing"
	"time"
)

// The heartbeat monitor is the same under every error policy (as PyTorch's
// is): a watchdog that stops counting ends the process after the timeout,
// with a dump, the stacks, one fatal line and exit 134.
func TestHeartbeat(t *testing.T) {
	const timeout = 480 * time.Second
	fired := []string{
		"dump(heartbeat monitor: watchdog heartbeat of backend nccl has not moved for 8m0s (heartbeat timeout 8m0s))",
		"stacks",
		"fatal(watchdog heartbeat of backend nccl has not moved for 8m0s (heartbeat timeout 8m0s))",
		"exit(134, grace 0s)",
	}
	cases := []struct {
		name  string
		beats []uint64        // one per observation
		times []time.Duration // when
		want  [][]string      // per observation; nil is none
	}{
		{
			name:  "advancing",
			beats: []uint64{1, 2, 3, 4},
			times: []time.Duration{0, 300 * time.Second, 600 * time.Second, 900 * time.Second},
			want:  [][]string{nil, nil, nil, nil},
		},
		{
			name:  "hung watchdog",
			beats: []uint64{7, 7, 7, 7},
			times: []time.Duration{0, time.Second, timeout - time.Millisecond, timeout},
			want:  [][]string{nil, nil, nil, fired},
		},
		{
			name:  "a beat restarts the clock",
			beats: []uint64{7, 7, 8, 8, 8},
			times: []time.Duration{0, 400 * time.Second, 470 * time.Second, 900 * time.Second, 950 * time.Second},
			want:  [][]string{nil, nil, nil, nil, fired},
		},
		{
			name:  "fires once",
			beats: []uint64{1, 1, 1},
			times: []time.Duration{0, timeout, 2 * timeout},
			want:  [][]string{nil, fired, nil},
		},
	}
	for _, c := range cases {
		for _, p := range policies {
			t.Run(c.name+"/"+p.String(), func(t *testing.T) {
				h := NewHeartbeat[string](timeout)
				other := uint64(0)
				for i, b := range c.beats {
					now := at(c.times[i])
					// Another backend that advances never hides the hung one.
					other++
					if acts := h.Observe(now, "gloo", "cpupool", other); acts != nil {
						t.Fatalf("the advancing backend fired: %v", strs(acts))
					}
					got := strs(h.Observe(now, "nccl", "nccl", b))
					want := c.want[i]
					if want == nil {
						want = []string{}
					}
					if !slices.Equal(got, want) {
						t.Fatalf("observation %d: got %v, want %v", i, got, want)
					}
				}
			})
		}
	}
}

func TestDumps(t *testing.T) {
	d := &Dumps{}
	if got := strs(d.Error("nccl allreduce seq 1 on rank 0: timeout")); !slices.Equal(got, []string{"dump(error: nccl allreduce seq 1 on rank 0: timeout)"}) {
		t.Fatalf("first error: %v", got)
	}
	if d.Error("again") != nil {
		t.Fatal("the second error dumped")
	}
	d.OwnSignal("rank 0: x")
	if d.PeerSignal("rank 0: x") != nil {
		t.Fatal("this rank's own signal dumped")
	}
	if got := strs(d.PeerSignal("rank 1: y")); !slices.Equal(got, []string{"dump(peer asked: rank 1: y)"}) {
		t.Fatalf("peer signal: %v", got)
	}
	if d.PeerSignal("rank 1: y") != nil {
		t.Fatal("the same signal dumped twice")
	}
	off := &Dumps{NoDumpOnError: true}
	if off.Error("x") != nil {
		t.Fatal("NoDumpOnError dumped")
	}
}
