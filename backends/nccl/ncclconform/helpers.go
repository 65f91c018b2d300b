package ncclconform

import (
	"fmt"
	"math"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/backends/nccl"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/cuda"
)

// The GPU specs port the proofs of backends/nccl's tests to the suite,
// with stream gates, in conformance.GPU's environment (see its rules).

// gpuEnv is conformance.GPU plus the nccl backend serving s.PG's CUDA
// tensors.
type gpuEnv struct {
	*conformance.GPU
	b *nccl.Backend
}

// gpu returns the spec's GPU environment, or skips: "no CUDA device" when
// the run puts tensors elsewhere, or when CUDA tensors do not go to nccl.
// The caller defers e.Close().
func gpu(s *conformance.Suite) *gpuEnv {
	GinkgoHelper()
	g, b := conformance.GPUFor[*nccl.Backend](s, "the nccl backend's")
	return &gpuEnv{GPU: g, b: b}
}

// ncclStream is the internal stream async ops run on.
func (e *gpuEnv) ncclStream() *cuda.Stream {
	GinkgoHelper()
	ns, err := e.b.Stream(e.Ctx, e.Ord)
	Expect(err).NotTo(HaveOccurred())
	return ns
}

// meta numbers an op that a spec issues on the backend directly (the
// dispatcher has no coalescing blocks).
func (e *gpuEnv) meta(op backend.Op) backend.Meta {
	return backend.Meta{Op: op, Seq: e.S.NextSeq(), Timeout: e.S.Timeout}
}

// pinnedF32 reads float32 element i of pinned memory.
func pinnedF32(h *cuda.HostBuffer, i int) float64 {
	b := h.Bytes()[4*i : 4*i+4]
	return float64(math.Float32frombits(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24))
}

// f32bits is the bit pattern of a float32, for Memset32.
func f32bits(f float32) uint32 { return math.Float32bits(f) }

// expectAll fails unless every element of got is want(i).
func expectAll(got []float64, want func(i int) float64, what string) {
	GinkgoHelper()
	for i, g := range got {
		if w := want(i); g != w {
			Fail(fmt.Sprintf("%s: element %d is %v, want %v", what, i, g, w))
		}
	}
}

// sumRanks is 1 + 2 + ... + size: the sum of every rank's rank+1.
func sumRanks(s *conformance.Suite) float64 { return float64(s.Size * (s.Size + 1) / 2) }
