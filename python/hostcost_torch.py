#!/usr/bin/python3
"""torch's host cost per all_reduce call, the peer of `conftest bench hostcost`.

One rank (world 1, a HashStore), 1-element float32 all_reduce, in batches of
--batch calls; the launch queue (nccl) or the work queue (gloo) is drained
after each batch, outside the timed part. For each of --reps rounds it
prints, for each mode in turn,
"HOSTCOST <mode> <wall ns per call> <thread CPU ns per call>":
  sync   dist.all_reduce(t) (nccl: on the current stream; gloo: blocks)
  async  dist.all_reduce(t, async_op=True) then work.wait(), each call
  issue  dist.all_reduce(t, async_op=True) alone; the waits come after the batch
Needs torch (the GPU machine's python3 is torch 2.11; Debian: python3-torch).
"""
import argparse
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    p.add_argument("--ops", type=int, default=20000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    kw = {}
    if args.backend == "nccl":
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        kw["device_id"] = dev
    else:
        dev = torch.device("cpu")
    dist.init_process_group(args.backend, store=dist.HashStore(), rank=0, world_size=1, **kw)
    t = torch.zeros(1, dtype=torch.float32, device=dev)

    def drain():
        if args.backend == "nccl":
            torch.cuda.synchronize()

    def sync_mode(n):
        for _ in range(n):
            dist.all_reduce(t)

    def async_mode(n):
        for _ in range(n):
            dist.all_reduce(t, async_op=True).wait()

    works = []

    def issue_mode(n):
        for _ in range(n):
            works.append(dist.all_reduce(t, async_op=True))

    def settle():
        for w in works:
            w.wait()
        works.clear()

    modes = [("sync", sync_mode), ("async", async_mode), ("issue", issue_mode)]
    for _, fn in modes:  # warm up
        fn(args.batch)
        settle()
        drain()
    for _ in range(args.reps):
        for name, fn in modes:
            wall = cpu = 0
            done = 0
            while done < args.ops:
                n = min(args.batch, args.ops - done)
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                fn(n)
                wall += time.perf_counter_ns() - w0
                cpu += time.thread_time_ns() - c0
                settle()
                drain()
                done += n
            print(f"HOSTCOST {name} {wall / args.ops:.1f} {cpu / args.ops:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
