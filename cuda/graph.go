package cuda

/*
#include "dl.h"
*/
import "C"

// CaptureStatus is a stream's graph-capture state (CUstreamCaptureStatus).
type CaptureStatus int

// The capture states.
const (
	CaptureNone        CaptureStatus = 0
	CaptureActive      CaptureStatus = 1
	CaptureInvalidated CaptureStatus = 2
)

// CaptureMode is how a capture interacts with other threads
// (CUstreamCaptureMode).
type CaptureMode int

// The capture modes. ThreadLocal and Global captures are tied to the OS
// thread: lock it (runtime.LockOSThread) from BeginCapture to EndCapture.
const (
	CaptureModeGlobal      CaptureMode = 0
	CaptureModeThreadLocal CaptureMode = 1
	CaptureModeRelaxed     CaptureMode = 2
)

// CaptureStatus reports whether s is being captured into a graph. Backends
// ask it so that captured ops are not handed to their watchdog, as
// ProcessGroupNCCL does.
func (s *Stream) CaptureStatus() (CaptureStatus, error) {
	if s.Handle() == 0 {
		// The legacy stream cannot be captured; asking would fail during a
		// global capture elsewhere.
		return CaptureNone, nil
	}
	var st C.int
	if err := check("cuStreamIsCapturing", C.gc_stream_is_capturing(C.uintptr_t(s.ctx), C.uintptr_t(s.handle), &st)); err != nil {
		return CaptureNone, err
	}
	return CaptureStatus(st), nil
}

// BeginCapture starts capturing the work queued on s into a graph.
func (s *Stream) BeginCapture(mode CaptureMode) error {
	return check("cuStreamBeginCapture_v2", C.gc_stream_begin_capture(C.uintptr_t(s.ctx), C.uintptr_t(s.handle), C.int(mode)))
}

// Graph is an executable CUDA graph captured from a stream.
type Graph struct {
	graph, exec uintptr
	ctx         uintptr
}

// EndCapture ends the capture on s and instantiates the graph.
func (s *Stream) EndCapture() (*Graph, error) {
	var g C.uintptr_t
	if err := check("cuStreamEndCapture", C.gc_stream_end_capture(C.uintptr_t(s.ctx), C.uintptr_t(s.handle), &g)); err != nil {
		return nil, err
	}
	var e C.uintptr_t
	if err := check("cuGraphInstantiateWithFlags", C.gc_graph_instantiate(C.uintptr_t(s.ctx), &e, g)); err != nil {
		C.gc_graph_destroy(C.uintptr_t(s.ctx), g)
		return nil, err
	}
	return &Graph{graph: uintptr(g), exec: uintptr(e), ctx: s.ctx}, nil
}

// Launch queues the graph on s.
func (g *Graph) Launch(s *Stream) error {
	return check("cuGraphLaunch", C.gc_graph_launch(C.uintptr_t(g.ctx), C.uintptr_t(g.exec), C.uintptr_t(s.Handle())))
}

// Destroy releases the graph.
func (g *Graph) Destroy() error {
	err := check("cuGraphExecDestroy", C.gc_graph_exec_destroy(C.uintptr_t(g.ctx), C.uintptr_t(g.exec)))
	if err2 := check("cuGraphDestroy", C.gc_graph_destroy(C.uintptr_t(g.ctx), C.uintptr_t(g.graph))); err == nil {
		err = err2
	}
	return err
}
