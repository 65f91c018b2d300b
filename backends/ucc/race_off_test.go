//go:build !race

package ucc

const raceOn = false
