// Package cuda loads the CUDA driver API at run time (dlopen of libcuda.so.1)
// and exposes what collectives need: devices, streams, events,
// stream-ordered memory and stream gates. The current stream rides in a
// context.Context, Go's stand-in for PyTorch's thread-local current stream.
package cuda

import "context"

// Stream is a CUDA stream on one device. The zero handle is the device's
// legacy default stream.
type Stream struct {
	handle uintptr // CUstream
	device int
}

// Handle returns the CUstream handle (0 for the default stream).
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	return s.handle
}

// Device returns the device ordinal the stream belongs to.
func (s *Stream) Device() int {
	if s == nil {
		return 0
	}
	return s.device
}

type streamKey struct{}

// WithStream returns a context whose current stream is s.
func WithStream(ctx context.Context, s *Stream) context.Context {
	return context.WithValue(ctx, streamKey{}, s)
}

// CurrentStream returns the stream set by WithStream, or nil, which means
// the device's default stream.
func CurrentStream(ctx context.Context) *Stream {
	s, _ := ctx.Value(streamKey{}).(*Stream)
	return s
}
