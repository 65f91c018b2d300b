//go:build !linux

package main

import (
	"errors"
	"time"
)

// loopConfig is one benchmark row.
type loopConfig struct {
	addr  string
	conns int
	rate  int
	dur   time.Duration
	cpu   int
	ring  bool
}

func runLoop(loopConfig) (result, error) {
	return result{}, errors.New("the bench client needs Linux (epoll)")
}
