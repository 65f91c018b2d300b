package ncclconform

import (
	"runtime"
	"time"

	. "github.com/onsi/ginkgo/v2" //nolint:revive
	. "github.com/onsi/gomega"    //nolint:revive

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/conformance"
	"github.com/gocoll/gocoll/cuda"
	"github.com/gocoll/gocoll/internal/frtrace"
	"github.com/gocoll/gocoll/tensor"
)

// CUDA graph capture through the dispatcher (issue 11, item 6): an op
// captured in sync mode did not run, and runs at each replay; its Work is
// neither failed nor pending, the flight recorder and the watchdog leave it
// alone (they used to query its end event, recorded during the capture,
// and report CUDA_ERROR_INVALID_VALUE as a failure, with a dump), and the
// replays dump nothing. The nccl backend's own form is
// backends/nccl's TestGraphCaptureSkipsWatchdog.

func init() { conformance.Define(defineNCCLGraph) }

func defineNCCLGraph(s *conformance.Suite) {
	Describe("nccl CUDA graph capture", Label(conformance.LabelStream), func() {
		It("sync mode: a captured allgather_into_tensor is not failed and not pending; replays run it; nothing is dumped", func() {
			e := gpu(s)
			defer e.Close()
			fr := s.PG.FlightRecorder()
			in := e.Fill(gpuN, func(int) float64 { return float64(s.Rank + 1) })
			out := e.Zeros(tensor.Float32, gpuN*s.Size)
			// The first collective connects the peers, which cannot be
			// captured: run one eagerly.
			s.Done(s.PG.AllgatherIntoTensor(e.Ctx, out, in, backend.AllgatherIntoTensorOptions{}))
			Expect(e.Cur.Memset32(out.Ptr(), 0, gpuN*s.Size)).To(Succeed())
			e.Sync()
			dumps := 0
			if fr != nil {
				dumps = fr.Dumps()
			}

			// Thread-local capture: the capturing thread must stay the same
			// from BeginCapture to EndCapture.
			runtime.LockOSThread()
			Expect(e.Cur.BeginCapture(cuda.CaptureModeThreadLocal)).To(Succeed())
			w, err := s.PG.AllgatherIntoTensor(e.Ctx, out, in, backend.AllgatherIntoTensorOptions{})
			gr, endErr := e.Cur.EndCapture()
			runtime.UnlockOSThread()
			Expect(err).NotTo(HaveOccurred())
			Expect(endErr).NotTo(HaveOccurred())
			defer func() { _ = gr.Destroy() }()
			cr, ok := w.(backend.CaptureReporter)
			Expect(ok && cr.Captured()).To(BeTrue(), "the Work of a captured op does not report it captured")
			expectAll(e.Read(out), func(int) float64 { return 0 }, "output after the capture (nothing ran)")

			for range 3 {
				Expect(gr.Launch(e.Cur)).To(Succeed())
			}
			expectAll(e.Read(out), func(i int) float64 { return float64(i/gpuN + 1) }, "allgather after the replays")

			// Several periods of the flight recorder's and the watchdog's
			// polls (100 ms each) go by.
			time.Sleep(350 * time.Millisecond)
			Expect(w.Exception()).To(BeNil())
			Expect(w.IsCompleted()).To(BeTrue(), "a captured op leaves nothing for the host to wait for")
			ctx, cancel := e.WaitCtx()
			defer cancel()
			Expect(w.WaitHost(ctx)).To(Succeed())
			Expect(w.Wait(e.Ctx)).To(Succeed())
			if fr != nil {
				var entry *frtrace.Entry
				snap := fr.Snapshot("conformance: graph capture")
				for i := range snap.Entries {
					if x := &snap.Entries[i]; !x.IsP2P && x.CollectiveSeqID == w.SeqNum() && x.ProfilingName == backend.OpAllgatherIntoTensor.ProfilingName(e.b.Name()) {
						entry = x
					}
				}
				Expect(entry).NotTo(BeNil(), "no flight recorder entry for the captured op (seq %d)", w.SeqNum())
				Expect(entry.Captured).To(BeTrue(), "%+v", *entry)
				Expect(entry.Error).To(BeEmpty())
				Expect(fr.Dumps()).To(Equal(dumps), "the capture or its replays dumped the flight recorder")
			}
			Expect(s.Sync()).To(Succeed())
		})
	})
}
