package frtrace

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
)

// sections is the registry of dump sections (Dump.Sections), by name.
var sections struct {
	mu sync.Mutex
	m  map[string]func(context.Context) any
}

// RegisterSection adds a section to every dump of this process: f returns
// its value (any JSON-encodable value) and should honour ctx's deadline;
// CollectSections stops waiting for it at that deadline in any case. A
// name registered twice keeps the later f.
func RegisterSection(name string, f func(context.Context) any) {
	sections.mu.Lock()
	defer sections.mu.Unlock()
	if sections.m == nil {
		sections.m = map[string]func(context.Context) any{}
	}
	sections.m[name] = f
}

// CollectSections runs every registered section's function at once and
// returns their JSON by name; nil when none is registered. A section that
// has not returned by ctx's end is {"error": "..."}: the dump, which the
// watchdog may be writing, never waits on it past the deadline.
func CollectSections(ctx context.Context) map[string]json.RawMessage {
	sections.mu.Lock()
	names := make([]string, 0, len(sections.m))
	fs := map[string]func(context.Context) any{}
	for n, f := range sections.m {
		names = append(names, n)
		fs[n] = f
	}
	sections.mu.Unlock()
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	type result struct {
		name string
		v    json.RawMessage
	}
	ch := make(chan result, len(names))
	for _, n := range names {
		go func() {
			b, err := json.Marshal(fs[n](ctx))
			if err != nil {
				b, _ = json.Marshal(map[string]string{"error": err.Error()})
			}
			ch <- result{n, b}
		}()
	}
	out := make(map[string]json.RawMessage, len(names))
	for range names {
		select {
		case r := <-ch:
			out[r.name] = r.v
		case <-ctx.Done():
			for _, n := range names {
				if _, ok := out[n]; !ok {
					out[n], _ = json.Marshal(map[string]string{"error": fmt.Sprintf("section %s did not answer in time: %v", n, context.Cause(ctx))})
				}
			}
			return out
		}
	}
	return out
}
