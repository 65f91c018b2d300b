// Command allreduce is the smallest complete gocoll program: every rank
// contributes rank+1 and checks that the sum came back.
//
// Run it under any launcher that sets torchrun's variables (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or let it start the ranks itself:
//
//	go run ./examples/allreduce -nproc 4
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/backend"
	_ "github.com/gocoll/gocoll/backends/cpupool"
	"github.com/gocoll/gocoll/dispatcher"
	"github.com/gocoll/gocoll/tensor"
)

func main() {
	nproc := flag.Int("nproc", 2, "ranks to start when RANK is not set (at least 1)")
	n := flag.Int("n", 1<<20, "elements per rank (at least 1)")
	flag.Parse()
	log.SetFlags(0)
	if err := checkFlags(*nproc, *n, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		flag.Usage()
		os.Exit(2)
	}
	if _, ok := os.LookupEnv("RANK"); !ok {
		if err := launch(*nproc); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := rank(*n); err != nil {
		log.Fatal(err)
	}
}

// checkFlags rejects values that would start nothing or that no
// allocation can hold, naming them, before any rank starts.
func checkFlags(nproc, n int, rest []string) error {
	switch {
	case nproc < 1:
		return fmt.Errorf("-nproc %d: want at least 1 rank", nproc)
	case n < 1:
		return fmt.Errorf("-n %d: want at least 1 element", n)
	case n > 1<<30:
		return fmt.Errorf("-n %d: want at most %d elements (4 GiB of float32)", n, 1<<30)
	case len(rest) > 0:
		return fmt.Errorf("unexpected arguments %q", rest)
	}
	return nil
}

// launch starts nproc copies of this program as ranks, torchrun-style.
func launch(nproc int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmds := make([]*exec.Cmd, nproc)
	for r := range cmds {
		c := exec.Command(self, os.Args[1:]...)
		c.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(nproc), "LOCAL_WORLD_SIZE="+strconv.Itoa(nproc),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			stopAll(cmds[:r])
			return err
		}
		cmds[r] = c
	}
	// The first rank to fail ends the run: the others would wait for it
	// until their timeout.
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, nproc)
	for r, c := range cmds {
		go func() { exits <- exit{r, c.Wait()} }()
	}
	var first error
	for range cmds {
		e := <-exits
		if e.err != nil && first == nil {
			first = fmt.Errorf("rank %d: %w", e.rank, e.err)
			stopAll(cmds)
		}
	}
	return first
}

// stopAll ends the ranks still running (signalling one that has exited
// fails harmlessly).
func stopAll(cmds []*exec.Cmd) {
	for _, c := range cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
}

func rank(n int) error {
	ctx := context.Background()
	pg, err := dispatcher.InitFromEnv(ctx, dispatcher.Config{Backend: "cpupool", Timeout: time.Minute})
	if err != nil {
		return err
	}
	defer pg.Close(ctx)
	data := make([]float32, n)
	for i := range data {
		data[i] = float32(pg.Rank() + 1)
	}
	x, err := tensor.FromSlice(data)
	if err != nil {
		return err
	}
	start := time.Now()
	w, err := pg.Allreduce(ctx, []*tensor.Tensor{x}, backend.AllreduceOptions{})
	if err != nil {
		return err
	}
	if err := w.Wait(ctx); err != nil {
		return err
	}
	took := time.Since(start)
	got, err := tensor.ToSlice[float32](x)
	if err != nil {
		return err
	}
	want := float32(pg.Size() * (pg.Size() + 1) / 2)
	for i, v := range got {
		if v != want {
			return fmt.Errorf("rank %d: element %d is %v, want %v", pg.Rank(), i, v, want)
		}
	}
	fmt.Printf("rank %d/%d: allreduce of %d float32 = %v everywhere, in %v%s\n", pg.Rank(), pg.Size(), n, want, took.Round(time.Microsecond), launchedBy())
	return nil
}

// launchedBy describes the launch as the variables tell it, e.g. " (local
// rank 1 of 2 on node 0 of 1, torchrun's agent store, run none, attempt
// 0)", so that a run under torchrun shows what gocoll read.
func launchedBy() string {
	env, err := dispatcher.ReadEnv()
	if err != nil {
		return ""
	}
	s := fmt.Sprintf(" (local rank %d of %d on node %d of %d", env.LocalRank, env.LocalWorldSize, env.GroupRank, env.GroupWorldSize)
	if env.UseAgentStore {
		s += ", torchrun's agent store"
	} else {
		s += ", store on rank 0"
	}
	if _, ok := os.LookupEnv("TORCHELASTIC_RUN_ID"); ok {
		s += fmt.Sprintf(", run %s, attempt %d of at most %d", env.RunID, env.RestartCount, env.MaxRestarts+1)
	}
	return s + ")"
}
