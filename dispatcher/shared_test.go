package dispatcher

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/gocoll/gocoll/backend"
	"github.com/gocoll/gocoll/store"
	"github.com/gocoll/gocoll/tensor"
)

// bothBuilt counts the instances of "recboth", which serves CPU and CUDA.
var bothBuilt, bothClosed atomic.Int32

type closeCounter struct{ *recorder }

func (c closeCounter) Close(context.Context) error { bothClosed.Add(1); return nil }

func init() {
	backend.Register(backend.Driver{Name: "recboth", Devices: []tensor.DeviceType{tensor.CPU, tensor.CUDA}, New: func(ctx context.Context, cfg backend.Config) (backend.Backend, error) {
		bothBuilt.Add(1)
		return closeCounter{&recorder{name: "recboth", cfg: cfg, log: &callLog{}}}, nil
	}})
}

// One backend named for two device types is one instance, told both
// types, and closed once (PyTorch builds one backend per name; two
// instances would wire up twice over the same store keys).
func TestOneBackendPerName(t *testing.T) {
	for _, bs := range []string{"cpu:recboth,cuda:recboth", "recboth"} {
		bothBuilt.Store(0)
		bothClosed.Store(0)
		pg, err := Init(context.Background(), Config{Store: store.NewHashStore(), WorldSize: 1, Backend: bs})
		if err != nil {
			t.Fatal(err)
		}
		cpu, err1 := pg.Backend(tensor.CPU)
		cuda, err2 := pg.Backend(tensor.CUDA)
		if err1 != nil || err2 != nil || cpu != cuda {
			t.Fatalf("%q: cpu %v (%v), cuda %v (%v): want one instance", bs, cpu, err1, cuda, err2)
		}
		if got := cpu.(closeCounter).cfg.Devices; !slices.Equal(got, []tensor.DeviceType{tensor.CPU, tensor.CUDA}) {
			t.Errorf("%q: Config.Devices %v, want [cpu cuda]", bs, got)
		}
		if err := pg.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if bothBuilt.Load() != 1 || bothClosed.Load() != 1 {
			t.Errorf("%q: built %d, closed %d; want 1 and 1", bs, bothBuilt.Load(), bothClosed.Load())
		}
	}
}
