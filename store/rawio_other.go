//go:build !linux

package store

import "net"

// rawIO is Linux only; elsewhere connections use net.Conn's Read and Write.
type rawIO struct{ net.Conn }

func newRawIO(net.Conn) (rd, wr *rawIO) { return nil, nil }
