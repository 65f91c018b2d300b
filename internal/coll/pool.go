package coll

import (
	"math/bits"
	"sync"
)

// Pool recycles byte buffers in power-of-two size classes, so that the
// scratch space of an op and the buffers of unexpected messages are reused
// instead of allocated per message. The zero value is ready to use.
type Pool struct {
	mu   sync.Mutex
	free [64][][]byte
	// Keep bounds how many buffers a class keeps (default 8); beyond it Put
	// drops the buffer for the garbage collector.
	Keep int
}

func class(n int) int {
	if n <= 64 {
		return 6
	}
	return bits.Len(uint(n - 1))
}

// Get returns a buffer of length n (its contents are unspecified).
func (p *Pool) Get(n int) []byte {
	c := class(n)
	p.mu.Lock()
	if l := len(p.free[c]); l > 0 {
		b := p.free[c][l-1]
		p.free[c][l-1] = nil
		p.free[c] = p.free[c][:l-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, 1<<c)
}

// Put returns a buffer that Get handed out.
func (p *Pool) Put(b []byte) {
	if b == nil || cap(b) == 0 || cap(b)&(cap(b)-1) != 0 {
		return
	}
	c := class(cap(b))
	keep := p.Keep
	if keep <= 0 {
		keep = 8
	}
	p.mu.Lock()
	if len(p.free[c]) < keep {
		p.free[c] = append(p.free[c], b[:cap(b)])
	}
	p.mu.Unlock()
}
