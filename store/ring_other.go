//go:build !linux

package store

import "github.com/gocoll/gocoll/internal/uring"

// ringEngine exists only on Linux; elsewhere every connection has its own
// goroutine.
type ringEngine struct{}

type ringConn struct{}

func startRing(*TCPServer) (*ringEngine, error) { return nil, uring.ErrUnsupported }

func (*ringEngine) adopt(*srvConn) bool { return false }
func (*ringEngine) kick(*srvConn)       {}
func (*ringEngine) stop()               {}
func (*ringEngine) numConns() int       { return 0 }
