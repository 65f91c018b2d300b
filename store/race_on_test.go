//go:build race

package store

// raceRSS: the race detector's shadow memory multiplies a process's
// RSS, so the attack tests scale their memory limits by raceRSS.
const raceRSS = 4
