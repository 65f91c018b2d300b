package tensor

import "fmt"

// DType is an element type. The names follow PyTorch's.
type DType uint8

// The element types.
const (
	Float32 DType = iota
	Float64
	Float16
	BFloat16
	Int8
	Uint8
	Int32
	Int64
	Bool
	Float8E4M3 // float8_e4m3fn: no infinities, one NaN pattern per sign
	Float8E5M2 // float8_e5m2: IEEE-like, with infinities
	numDTypes
)

var dtypeInfo = [numDTypes]struct {
	name  string
	size  int
	float bool
}{
	Float32:    {"float32", 4, true},
	Float64:    {"float64", 8, true},
	Float16:    {"float16", 2, true},
	BFloat16:   {"bfloat16", 2, true},
	Int8:       {"int8", 1, false},
	Uint8:      {"uint8", 1, false},
	Int32:      {"int32", 4, false},
	Int64:      {"int64", 8, false},
	Bool:       {"bool", 1, false},
	Float8E4M3: {"float8_e4m3fn", 1, true},
	Float8E5M2: {"float8_e5m2", 1, true},
}

// DTypes lists every element type, in declaration order.
func DTypes() []DType {
	out := make([]DType, numDTypes)
	for i := range out {
		out[i] = DType(i)
	}
	return out
}

// Valid reports whether d is one of the declared types.
func (d DType) Valid() bool { return d < numDTypes }

// String returns PyTorch's name, e.g. "bfloat16".
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// Size returns the element size in bytes.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d.Valid() && dtypeInfo[d].float }

// IsInteger reports whether d is an integer type or bool, the types that
// bitwise reductions accept.
func (d DType) IsInteger() bool { return d.Valid() && !dtypeInfo[d].float }

// ParseDType reads a name as String writes it.
func ParseDType(s string) (DType, error) {
	for i, in := range dtypeInfo {
		if in.name == s {
			return DType(i), nil
		}
	}
	return 0, fmt.Errorf("tensor: unknown dtype %q", s)
}
