//go:build race

package ucc

// raceOn: the race detector is on (it drops sync.Pool items at random and
// allocates on its own).
const raceOn = true
