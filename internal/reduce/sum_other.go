//go:build !amd64

package reduce

// sumFloat32 is sum for float32 (sum_amd64.go vectorises it on amd64).
func sumFloat32(d, s []float32) { sum(d, s) }

// sumFloat64 is sum for float64.
func sumFloat64(d, s []float64) { sum(d, s) }
