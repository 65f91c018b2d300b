//go:build !cgo

package cpupool

import "github.com/gocoll/gocoll/tensor"

// Without cgo there is no CUDA driver binding: cpupool serves the host's
// tensors only.
var servedDevices = []tensor.DeviceType{tensor.CPU}

// newServed is the registered factory.
var newServed = New
