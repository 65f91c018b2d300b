//go:build !race

package store

const raceRSS = 1
