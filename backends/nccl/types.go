package nccl

/*
#include "nccl_dl.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/tensor"
)

// call is one NCCL call of an op.
type call struct {
	kind   C.int
	send   uintptr
	recv   uintptr
	count  int
	dt     C.int
	op     C.int
	scalar uint64
	root   int // root, or peer for send/recv
}

// ncclType maps a dtype to ncclDataType_t. Bool moves as uint8, as in
// PyTorch.
func ncclType(dt tensor.DType) (C.int, error) {
	switch dt {
	case tensor.Int8:
		return 0, nil
	case tensor.Uint8, tensor.Bool:
		return 1, nil
	case tensor.Int32:
		return 2, nil
	case tensor.Int64:
		return 4, nil
	case tensor.Float16:
		return 6, nil
	case tensor.Float32:
		return 7, nil
	case tensor.Float64:
		return 8, nil
	case tensor.BFloat16:
		return 9, nil
	case tensor.Float8E4M3, tensor.Float8E5M2:
		if lib.version < 22400 {
			return 0, fmt.Errorf("%w: %v needs NCCL 2.24 or newer (loaded %s)", backend.ErrUnsupported, dt, VersionString(lib.version))
		}
		if dt == tensor.Float8E4M3 {
			return 10, nil
		}
		return 11, nil
	}
	return 0, fmt.Errorf("%w: NCCL cannot move dtype %v", backend.ErrUnsupported, dt)
}

// redOp maps a ReduceOp for dtype dt to ncclRedOp_t; -1 means PREMUL_SUM
// with the returned scalar (raw bits of dt).
func redOp(r backend.ReduceOp, dt tensor.DType, worldOne bool) (C.int, uint64, error) {
	if r.Bitwise() {
		return 0, 0, fmt.Errorf("%w: Cannot use ReduceOp.%v with NCCL", backend.ErrUnsupported, r.Type)
	}
	if dt == tensor.Bool {
		// PyTorch: bool SUM is a logical or (MAX), PRODUCT a logical and (MIN).
		switch r.Type {
		case backend.Sum:
			return 2, 0, nil
		case backend.Product:
			return 3, 0, nil
		case backend.Avg, backend.PreMulSum:
			return 0, 0, fmt.Errorf("%w: Cannot use ReduceOp.%v with boolean inputs", backend.ErrInvalidArgument, r.Type)
		}
	}
	switch r.Type {
	case backend.Sum:
		return 0, 0, nil
	case backend.Product:
		return 1, 0, nil
	case backend.Max:
		return 2, 0, nil
	case backend.Min:
		return 3, 0, nil
	case backend.Avg:
		if worldOne {
			// The average of one value is the value; NCCL 2.28 rejects
			// float8 AVG on a one-rank communicator.
			return 0, 0, nil
		}
		return 4, 0, nil
	case backend.PreMulSum:
		switch dt {
		case tensor.Float32:
			return -1, uint64(math.Float32bits(float32(r.Factor))), nil
		case tensor.Float64:
			return -1, math.Float64bits(r.Factor), nil
		case tensor.Float16, tensor.BFloat16, tensor.Float8E4M3, tensor.Float8E5M2:
			if worldOne && (dt == tensor.Float8E4M3 || dt == tensor.Float8E5M2) {
				// Seen on NCCL 2.28.3: ncclInvalidArgument for a float8
				// PREMUL_SUM on a one-rank communicator.
				return 0, 0, fmt.Errorf("%w: NCCL cannot do PREMUL_SUM on %v with a single rank", backend.ErrUnsupported, dt)
			}
			h, err := tensor.FromFloat64s(dt, []float64{r.Factor})
			if err != nil {
				return 0, 0, err
			}
			var b [8]byte
			copy(b[:], h.Bytes())
			return -1, binary.LittleEndian.Uint64(b[:]), nil
		}
		return 0, 0, fmt.Errorf("%w: Cannot use ReduceOp.PREMUL_SUM with dtype %v on NCCL (floating types only)", backend.ErrUnsupported, dt)
	}
	return 0, 0, fmt.Errorf("%w: unknown reduce op %v", backend.ErrInvalidArgument, r)
}

// opCallName is the NCCL entry point of a call kind, for errors.
func opCallName(kind C.int) string {
	switch kind {
	case C.GN_ALLREDUCE:
		return "ncclAllReduce"
	case C.GN_BROADCAST:
		return "ncclBroadcast"
	case C.GN_REDUCE:
		return "ncclReduce"
	case C.GN_ALLGATHER:
		return "ncclAllGather"
	case C.GN_REDUCESCATTER:
		return "ncclReduceScatter"
	case C.GN_SEND:
		return "ncclSend"
	case C.GN_RECV:
		return "ncclRecv"
	case C.GN_ALLTOALL:
		return "ncclAlltoAll"
	case C.GN_GATHER:
		return "ncclGather"
	case C.GN_SCATTER:
		return "ncclScatter"
	}
	return "nccl"
}
