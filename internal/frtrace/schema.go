// Package frtrace holds the flight recorder's dump format and the analyzer
// that reads every rank's dump and finds the first collective where the
// ranks disagree, as PyTorch's fr_trace does.
//
// The field names are those of PyTorch's flight recorder (schema version
// 2.10), so its tools and ours read each other's dumps; fields PyTorch does
// not have (rank, world_size, backend) are extra keys that its reader
// ignores.
package frtrace

import "encoding/json"

// Version is the dump schema version, PyTorch's.
const Version = "2.10"

// States of an entry.
const (
	StateScheduled = "scheduled"
	StateStarted   = "started"
	StateCompleted = "completed"
)

// Dump is one rank's flight-recorder dump.
type Dump struct {
	Version        string              `json:"version"`
	CommLibVersion string              `json:"comm_lib_version"`
	Rank           int                 `json:"rank"`
	WorldSize      int                 `json:"world_size"`
	PGConfig       map[string]PGConfig `json:"pg_config"`
	PGStatus       map[string]PGStatus `json:"pg_status"`
	Entries        []Entry             `json:"entries"`
	DumpReason     string              `json:"dump_reason,omitempty"`
	DumpTimeNs     int64               `json:"dump_time_ns"`
	// DumpTime is DumpTimeNs as RFC 3339 (UTC), for people reading a dump.
	DumpTime string `json:"dump_time,omitempty"`
	// RunID and PGUID identify the job (JobID): the run id the launcher
	// gave (TORCHELASTIC_RUN_ID, dispatcher.Config.RunID) and the uid rank
	// 0 drew for the default group at Init. Not in PyTorch's schema.
	RunID string `json:"run_id,omitempty"`
	PGUID string `json:"pg_uid,omitempty"`
	// Sections are what the packages linked into the process add to every
	// dump (RegisterSection), by name: "nvml" holds the NVML snapshots of
	// the process's GPUs (internal/gpuinfo). PyTorch's reader ignores it.
	Sections map[string]json.RawMessage `json:"sections,omitempty"`
}

// Producer is the comm_lib_version of gocoll's dumps, which tells them
// from PyTorch's and other programs' JSON files.
const Producer = "gocoll"

// JobID names the dump's job: "run R, pg_uid U", "-" for a missing part
// (dumps of versions before these fields have "run -, pg_uid -").
func (d *Dump) JobID() string {
	part := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	return "run " + part(d.RunID) + ", pg_uid " + part(d.PGUID)
}

// PGConfig describes a process group.
type PGConfig struct {
	Name  string `json:"name"`
	Desc  string `json:"desc"`
	Ranks []int  `json:"ranks"`
}

// PGStatus is a group's progress: the last collective sequence numbers
// enqueued, started (-1 when not known) and completed.
type PGStatus struct {
	LastEnqueued  int64 `json:"last_enqueued_collective"`
	LastStarted   int64 `json:"last_started_collective"`
	LastCompleted int64 `json:"last_completed_collective"`
}

// Entry is one recorded op.
type Entry struct {
	RecordID        uint64    `json:"record_id"`
	PGID            string    `json:"pg_id"`
	ProcessGroup    [2]string `json:"process_group"` // name, desc
	CollectiveSeqID uint64    `json:"collective_seq_id"`
	P2PSeqID        uint64    `json:"p2p_seq_id"`
	OpID            uint64    `json:"op_id"`
	ProfilingName   string    `json:"profiling_name"`
	TimeCreatedNs   int64     `json:"time_created_ns"`
	InputSizes      [][]int   `json:"input_sizes"`
	InputDtypes     []string  `json:"input_dtypes"`
	OutputSizes     [][]int   `json:"output_sizes"`
	OutputDtypes    []string  `json:"output_dtypes"`
	State           string    `json:"state"`
	TimeStartedNs   int64     `json:"time_discovered_started_ns"`
	TimeCompletedNs int64     `json:"time_discovered_completed_ns"`
	Retired         bool      `json:"retired"`
	TimeoutMs       int64     `json:"timeout_ms"`
	IsP2P           bool      `json:"is_p2p"`
	DurationMs      *float64  `json:"duration_ms,omitempty"`
	ThreadID        string    `json:"thread_id"`
	ThreadName      string    `json:"thread_name"`
	Error           string    `json:"error,omitempty"`
	// Captured marks an op captured into a CUDA graph: it did not run when
	// recorded, and runs at each replay, so it stays scheduled (retired).
	// Not in PyTorch's schema; its reader ignores the key.
	Captured bool `json:"captured,omitempty"`
}
