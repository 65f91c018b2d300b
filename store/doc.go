// Package store holds the key-value stores that ranks rendezvous through:
// the Store interface, a TCPStore server and client that speak PyTorch's
// wire protocol, and the Prefix, Hash and File stores.
//
// # TCPStore
//
// TCPServer serves PyTorch's TCPStore protocol in both numberings at once:
// PyTorch ≥ 2.2 clients (DialectV2, recognised by their VALIDATE handshake)
// and 1.x/2.0 clients (DialectV1). TCPStore is the client; it speaks
// DialectV2 by default and DialectV1 on request (ClientOptions.Dialect),
// and prefixes user keys with "/" as PyTorch does, so Go and torch ranks of
// one job see the same keys. NewTCPStore mirrors torch's constructor: the
// master starts the server and every rank, master included, is a client.
//
//	srv, err := store.NewTCPServer(ctx, store.ServerOptions{Addr: ":29500"})
//	c, err := store.DialTCPStore(ctx, "master:29500", store.ClientOptions{Timeout: time.Minute})
//	// or, torch style, on every rank:
//	s, err := store.NewTCPStore(ctx, "master:29500", store.TCPStoreOptions{
//		IsMaster: rank == 0, ClientOptions: store.ClientOptions{WorldSize: n}})
//
// # Hosting a rendezvous for PyTorch ranks
//
// The cmd/gocoll-store program runs the server on its own:
//
//	gocoll-store serve --addr 0.0.0.0:29500
//
// Start it on the master host and launch the torch ranks with
// MASTER_ADDR/MASTER_PORT pointing at it and TORCHELASTIC_USE_AGENT_STORE=1
// (every torch rank then connects as a client instead of rank 0 hosting the
// store), or pass store=TCPStore(host, port, is_master=False) to
// init_process_group. Torch 1.13 needs TORCHELASTIC_RESTART_COUNT=0 as well
// with the agent store. With --secret-file (or GOCOLL_STORE_SECRET; never
// on the command line, where ps shows it) the server admits only gocoll
// clients that know the secret; PyTorch clients cannot pass that
// handshake, so leave it off when torch ranks connect.
//
// # Limits and failure behaviour
//
// The server checks every length before allocating (keys ≤ 8 KiB, values ≤
// ServerOptions.MaxValueLen, ≤ 128 Ki keys per request) and closes a
// connection that sends malformed input, logging one line (at most 10 a
// second past a burst); other connections carry on. Queued replies and
// request buffers share one server-wide MemoryBudget (256 MiB): a
// connection whose reply does not fit stops being read until memory is
// released, while small replies always fit. A request must arrive whole
// within FrameTimeout (30 s), but idle connections are never closed;
// connections past MaxConns (from RLIMIT_NOFILE) are refused; a connection
// waits on at most MaxWaitKeysPerConn keys. Close closes every connection,
// so blocked clients fail at once with an error wrapping ErrClosed.
package store
