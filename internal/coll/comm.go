package coll

// Comm is a transport plus the tuning of the algorithms that run over it.
type Comm struct {
	T Transport
	// Pool supplies scratch buffers; nil means allocate.
	Pool *Pool
	// Segment is the size in bytes of the pieces large messages are cut
	// into, so that sending, receiving and reducing overlap (default 1 MiB, as Gloo's maxSegmentSize).
	Segment int
	// Window is how many segment receives are posted ahead (default 4).
	Window int
	// Small is the size in bytes up to which allreduce uses recursive
	// doubling instead of the ring (default 256 KiB).
	Small int
}

// Defaults of Comm.
const (
	DefaultSegment = 1 << 20
	DefaultWindow  = 4
	DefaultSmall   = 256 << 10
)

func (c *Comm) seg(elem int) int {
	s := c.Segment
	if s <= 0 {
		s = DefaultSegment
	}
	if elem > 1 {
		s -= s % elem
		if s == 0 {
			s = elem
		}
	}
	return s
}

func (c *Comm) window() int {
	if c.Window <= 0 {
		return DefaultWindow
	}
	return c.Window
}

func (c *Comm) get(n int) []byte {
	if c.Pool == nil {
		return make([]byte, n)
	}
	return c.Pool.Get(n)
}

func (c *Comm) put(b []byte) {
	if c.Pool != nil {
		c.Pool.Put(b)
	}
}

func mod(a, n int) int { return ((a % n) + n) % n }

// SplitEven cuts buf into n blocks of whole elements whose sizes differ by
// at most one element, the first ones larger.
func SplitEven(buf []byte, n, elem int) [][]byte {
	count := len(buf) / elem
	base, extra := count/n, count%n
	out := make([][]byte, n)
	off := 0
	for i := range out {
		l := base
		if i < extra {
			l++
		}
		out[i] = buf[off : off+l*elem]
		off += l * elem
	}
	return out
}

func total(blocks [][]byte) int {
	n := 0
	for _, b := range blocks {
		n += len(b)
	}
	return n
}
