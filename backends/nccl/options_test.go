package nccl

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/backend"
)

// TestOptionsFromEnvRejects: invalid values of the error-handling
// variables are errors at construction (PyTorch's
// test_invalid_nccl_blocking_wait_env), and the TORCH_ aliases are read.
func TestOptionsFromEnvRejects(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"GOCOLL_NCCL_BLOCKING_WAIT", "abc"}, {"GOCOLL_NCCL_BLOCKING_WAIT", "-1"},
		{"TORCH_NCCL_BLOCKING_WAIT", "2147483647"}, {"TORCH_NCCL_BLOCKING_WAIT", "4294967295"},
		{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING", "4"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "-1"},
		{"GOCOLL_NCCL_ASYNC_ERROR_HANDLING", "teardown"}, {"GOCOLL_NCCL_NAN_CHECK", "maybe"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			if _, err := OptionsFromEnv(); err == nil || !strings.Contains(err.Error(), tc.name) && !strings.Contains(err.Error(), "error policy") {
				t.Fatalf("want an error naming %s, got %v", tc.name, err)
			}
		})
	}
	t.Setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
	t.Setenv("TORCH_NCCL_NAN_CHECK", "1")
	t.Setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
	o, err := OptionsFromEnv()
	if err != nil || o.ErrorPolicy != CleanUpOnly || !o.NaNCheck || !o.BlockingWait {
		t.Fatalf("TORCH_ aliases: %+v, %v", o, err)
	}
	d := DefaultOptions()
	if d.ErrorPolicy != SkipCleanUp || d.AbortTimeout != 10*time.Second || d.NaNCheck {
		t.Fatalf("defaults: %+v", d)
	}
	d.AbortTimeout = 0
	if d.validate() == nil {
		t.Fatal("AbortTimeout 0 accepted")
	}
}

// TestFactoryFailureGivesNilBackend: a failed New must reach the dispatcher
// as a nil backend.Backend, not a typed nil it would later Close.
func TestFactoryFailureGivesNilBackend(t *testing.T) {
	b, err := factory(context.Background(), backend.Config{Options: 42})
	if err == nil {
		t.Fatal("factory with bad options succeeded")
	}
	if b != nil {
		t.Fatalf("factory failed (%v) but returned a non-nil backend.Backend (%T)", err, b)
	}
}
