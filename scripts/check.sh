#!/usr/bin/env bash
# The project's test command (README "Quick start"; .ci/run calls it):
# generated files current, go vet, gofmt, and the race-enabled tests.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== go generate (generated files must be current)"
go generate ./...
if ! git diff --exit-code --stat -- '*zz_generated_*' docs/ops.md; then
	echo "generated files are stale: run go generate ./... and commit" >&2
	exit 1
fi

echo "== the CPU stack builds without cgo (DESIGN.md: backend is a leaf contract)"
CGO_ENABLED=0 go build ./tensor ./reduceop ./store ./backend ./dispatcher ./internal/... ./backends/cpupool ./cmd/gocoll-store
if go list -deps ./backend | grep -qx 'github.com/gocoll/gocoll/cuda'; then
	echo "backend must not depend on cuda" >&2
	exit 1
fi
# Metrics are opt-in: only package metrics links Prometheus's client.
if go list -deps ./dispatcher ./backends/cpupool ./store | grep -q 'github.com/prometheus/'; then
	echo "dispatcher, cpupool and store must not depend on prometheus (package metrics does)" >&2
	exit 1
fi

echo "== go vet"
go vet ./...

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi

echo "== go test -race"
go test -race -timeout 20m ./...

# The store's TCP server has two engines; the run above used the default
# (io_uring where the kernel has it). The other runs the same tests here.
echo "== go test -race ./store with GOCOLL_STORE_ENGINE=goroutines"
GOCOLL_STORE_ENGINE=goroutines go test -race -timeout 10m ./store
