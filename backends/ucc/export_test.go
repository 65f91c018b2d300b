package ucc

import "github.com/gocoll/gocoll/backend"

// RawAllreduce is rawAllreduce of a backend New made, for the benchmarks.
func RawAllreduce(b backend.Backend, buf []byte, iters int, each bool) error {
	return b.(*Backend).rawAllreduce(buf, iters, each)
}
