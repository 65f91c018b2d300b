#!/usr/bin/python3
"""torch gloo allreduce benchmark, the peer of `conftest bench`.

Starts --nproc ranks (torch.multiprocessing) on 127.0.0.1:--port and, for
each size in --sizes (bytes, float32 SUM), prints "BENCH <bytes> <us>" from
rank 0: the mean time per all_reduce over the timed iterations, the maximum
over ranks. Iteration counts follow conftest's so the two are comparable.
Needs torch (Debian: apt-get install -y python3-torch).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, args):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.nproc
    )
    for b in [int(s) for s in args.sizes.split(",")]:
        t = torch.ones(b // 4, dtype=torch.float32)
        iters = max(3, int(args.iters * min(2000, max(5, (256 << 20) // b))))
        for _ in range(max(2, iters // 10)):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        us = torch.tensor([(time.perf_counter() - start) * 1e6 / iters], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"BENCH {b} {us.item():.2f}", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--sizes", default="8,1048576")
    p.add_argument("--iters", type=float, default=1.0)
    args = p.parse_args()
    mp.spawn(run, args=(args,), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
