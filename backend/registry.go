package backend

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/gocoll/gocoll/tensor"
)

// Factory constructs a backend for one group.
type Factory func(ctx context.Context, cfg Config) (Backend, error)

// Driver is what a backend registers: its name, the device types it serves
// when a backend string names it alone, and its constructor.
type Driver struct {
	Name    string
	Devices []tensor.DeviceType
	New     Factory
}

var (
	driversMu sync.RWMutex
	drivers   = map[string]Driver{}
)

// Register makes a backend available by name. It is meant to be called from
// the backend package's init; it panics when the name is taken or the driver
// is incomplete, as database/sql.Register does.
func Register(d Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if d.Name == "" || d.New == nil || len(d.Devices) == 0 {
		panic(fmt.Sprintf("backend: Register of incomplete driver %q", d.Name))
	}
	if _, dup := drivers[d.Name]; dup {
		panic("backend: Register called twice for " + d.Name)
	}
	drivers[d.Name] = d
}

// Lookup returns the registered driver called name.
func Lookup(name string) (Driver, bool) {
	driversMu.RLock()
	defer driversMu.RUnlock()
	d, ok := drivers[name]
	return d, ok
}

// Drivers returns the sorted names of the registered backends.
func Drivers() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	names := make([]string, 0, len(drivers))
	for n := range drivers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// DeviceMap says which backend serves each device type.
type DeviceMap map[tensor.DeviceType]string

// String writes the map as a backend string, CPU first.
func (m DeviceMap) String() string {
	types := make([]tensor.DeviceType, 0, len(m))
	for t := range m {
		types = append(types, t)
	}
	slices.Sort(types)
	parts := make([]string, len(types))
	for i, t := range types {
		parts[i] = t.String() + ":" + m[t]
	}
	return strings.Join(parts, ",")
}

// ParseBackendString reads a PyTorch backend string: either one backend
// name, which then serves every device type it registered for, or
// "device:backend" pairs separated by commas ("cpu:cpupool,cuda:nccl").
// Every backend named must be registered. The errors follow PyTorch's
// BackendConfig and wrap ErrInvalidArgument.
func ParseBackendString(s string) (DeviceMap, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return nil, fmt.Errorf("%w: empty backend string", ErrInvalidArgument)
	}
	m := DeviceMap{}
	if !strings.Contains(s, ":") {
		d, ok := Lookup(s)
		if !ok {
			return nil, fmt.Errorf("%w: Unknown backend %q (registered: %s)", ErrInvalidArgument, s, strings.Join(Drivers(), ", "))
		}
		for _, t := range d.Devices {
			m[t] = d.Name
		}
		return m, nil
	}
	usage := fmt.Sprintf("The backend string %q must be in the format \"<device_type1>:<backend1>,<device_type2>:<backend2>...\", e.g. \"cpu:cpupool,cuda:nccl\"", s)
	for _, pair := range strings.Split(s, ",") {
		dev, name, ok := strings.Cut(pair, ":")
		if !ok || dev == "" || name == "" || strings.Contains(name, ":") {
			return nil, fmt.Errorf("%w: Invalid device:backend pairing: %q. %s", ErrInvalidArgument, pair, usage)
		}
		t, err := tensor.ParseDeviceType(dev)
		if err != nil {
			return nil, fmt.Errorf("%w: Invalid device:backend pairing: %q: %v. %s", ErrInvalidArgument, pair, err, usage)
		}
		if _, dup := m[t]; dup {
			return nil, fmt.Errorf("%w: Duplicate device type %s in backend string %q", ErrInvalidArgument, dev, s)
		}
		d, ok := Lookup(name)
		if !ok {
			return nil, fmt.Errorf("%w: Unknown backend %q in %q (registered: %s)", ErrInvalidArgument, name, s, strings.Join(Drivers(), ", "))
		}
		if !slices.Contains(d.Devices, t) {
			return nil, fmt.Errorf("%w: backend %q does not serve device type %s", ErrInvalidArgument, name, t)
		}
		m[t] = name
	}
	return m, nil
}
