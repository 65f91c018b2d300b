package ncclhook

import "testing"

type opts struct{ x int }

func TestKnobsFollowThePointer(t *testing.T) {
	a, b := &opts{1}, &opts{1}
	Set(a, Knobs{DisableStash: true})
	if got := Of(a); !got.DisableStash || got.HangWatchdog {
		t.Fatalf("Of(a) = %+v, want DisableStash only", got)
	}
	if got := Of(b); got != (Knobs{}) {
		t.Fatalf("Of(b) = %+v: knobs leaked to an equal value at another address", got)
	}
	Set(a, Knobs{})
	if got := Of(a); got != (Knobs{}) {
		t.Fatalf("after detaching, Of(a) = %+v", got)
	}
}
