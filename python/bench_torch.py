#!/usr/bin/python3
"""torch.distributed's side of `conftest bench`: gloo on the CPU, NCCL on GPUs.

Starts --nproc ranks (torch.multiprocessing) on 127.0.0.1:--port and runs
conftest bench-rank's loop with torch: per op and size, -w warm-up ops, a
barrier, -n ops queued back to back (async_op=True) and waited for once at the
end (plus torch.cuda.synchronize() on GPUs), and with -c a fresh input, one
more op and a check of every output element; out-of-place, then in-place,
where torch has the form. Each rank prints one line per op and size:

    BENCH2 series op rank bytes count oop_us oop_wrong ip_us ip_wrong

("-": not run or not checked; an op the backend refuses prints "-" too).
The input pattern and the expected outputs are conftest's (bench_rank.go).
Runs under torch 1.13 (Debian python3-torch, gloo) and torch 2.11 (nccl).
"""
import argparse
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"]


def val(r, idx):
    """Element idx (a tensor of indices) of rank r: conftest's benchVal."""
    return ((r * 7 + idx) % 23 + 1).float()


def op_count(op, nbytes, n):
    c = nbytes // 4
    if op in ("allgather", "reduce_scatter", "alltoall"):
        c -= c % n
    return c


class Case:
    """One mode of one op: the input and output views and the expected output."""

    def __init__(self, op, send, recv, count, r, n, in_place):
        self.op, self.r, self.n, self.count, self.part = op, r, n, count, count // n
        whole = recv[:count]
        p = self.part
        if op in ("allreduce", "broadcast", "reduce", "alltoall", "sendrecv"):
            self.inp, self.out = (whole if in_place else send[:count]), whole
        elif op == "allgather":
            self.inp, self.out = (recv[r * p:(r + 1) * p] if in_place else send[:p]), whole
        elif op == "reduce_scatter":
            if in_place:
                self.inp, self.out = whole, recv[r * p:(r + 1) * p]
            else:
                self.inp, self.out = send[:count], recv[:p]

    def prepare(self):
        self.out.fill_(-1)
        idx = torch.arange(self.inp.numel(), device=self.inp.device)
        self.inp.copy_(val(self.r, idx))

    def expected(self):
        n, r, p = self.n, self.r, self.part
        idx = torch.arange(self.out.numel(), device=self.out.device)
        if self.op in ("allreduce", "reduce"):
            return sum(val(q, idx) for q in range(n))
        if self.op == "allgather":
            return val(idx // p, idx % p)
        if self.op == "reduce_scatter":
            return sum(val(q, r * p + idx) for q in range(n))
        if self.op == "broadcast":
            return val(0, idx)
        if self.op == "alltoall":
            return val(idx // p, r * p + idx % p)
        if self.op == "sendrecv":
            return val((r - 1 + n) % n, idx)
        raise ValueError(self.op)

    def wrong(self):
        if self.op == "reduce" and self.r != 0:
            return 0
        return int((self.out != self.expected()).sum().item())


def supports(op, in_place, n, backend):
    if op in ("allreduce", "broadcast", "reduce"):
        return in_place
    if op == "alltoall":
        return not in_place
    if op == "sendrecv":
        return not in_place and n > 1
    return True


def issue(c, works):
    """Queues one op of case c; appends its works."""
    op = c.op
    if op == "allreduce":
        works.append(dist.all_reduce(c.out, async_op=True))
    elif op == "allgather":
        if hasattr(dist, "all_gather_into_tensor") and c.out.is_cuda:
            works.append(dist.all_gather_into_tensor(c.out, c.inp, async_op=True))
        else:  # gloo: the list form, over views of the output
            works.append(dist.all_gather(list(c.out.chunk(c.n)), c.inp, async_op=True))
    elif op == "reduce_scatter":
        works.append(dist.reduce_scatter_tensor(c.out, c.inp, async_op=True))
    elif op == "broadcast":
        works.append(dist.broadcast(c.out, 0, async_op=True))
    elif op == "reduce":
        works.append(dist.reduce(c.out, 0, async_op=True))
    elif op == "alltoall":
        works.append(dist.all_to_all_single(c.out, c.inp, async_op=True))
    elif op == "sendrecv":
        ops = [dist.P2POp(dist.isend, c.inp, (c.r + 1) % c.n), dist.P2POp(dist.irecv, c.out, (c.r - 1 + c.n) % c.n)]
        works.extend(dist.batch_isend_irecv(ops))


def run_batch(c, iters):
    works = []
    for _ in range(iters):
        issue(c, works)
    for w in works:
        w.wait()
    if c.out.is_cuda:
        torch.cuda.synchronize()


def measure(c, iters, warm, check):
    c.prepare()
    run_batch(c, warm)
    dist.barrier()
    start = time.perf_counter()
    run_batch(c, iters)
    us = (time.perf_counter() - start) * 1e6 / iters
    wrong = -1
    if check:
        dist.barrier()
        c.prepare()
        if c.out.is_cuda:
            torch.cuda.synchronize()
        dist.barrier()
        run_batch(c, 1)
        wrong = c.wrong()
    return us, wrong


def rank_main(rank, args):
    device = "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.nproc)
    n = args.nproc
    sizes = [int(s) for s in args.sizes.split(",")]
    top = max(sizes) // 4
    send = torch.zeros(top, dtype=torch.float32, device=device)
    recv = torch.zeros(top, dtype=torch.float32, device=device)
    refused = set()
    for op in args.op.split(","):
        for b in sizes:
            count = op_count(op, b, n)
            if count == 0:
                continue
            iters, warm = args.n, args.w
            if iters == 0:
                iters = max(3, int(args.iters * min(2000, max(5, (256 << 20) // b))))
                warm = max(2, iters // 10)
            fields = []
            for in_place in (False, True):
                t, w = "-", "-"
                if supports(op, in_place, n, args.backend) and (op, in_place) not in refused:
                    c = Case(op, send, recv, count, rank, n, in_place)
                    try:
                        us, wrong = measure(c, iters, warm, args.c)
                        t = f"{us:.3f}"
                        w = str(wrong) if wrong >= 0 else "-"
                    except (RuntimeError, AttributeError, NotImplementedError, ValueError) as e:  # the backend lacks the op
                        refused.add((op, in_place))
                        if rank == 0:
                            print(f"bench_torch: {args.series} {op} ({'in' if in_place else 'out-of'}-place): {str(e).splitlines()[0]}",
                                  file=sys.stderr, flush=True)
                fields += [t, w]
            # One write per line: the ranks share the pipe, and print()
            # writes the newline separately.
            sys.stdout.write(f"BENCH2 {args.series} {op} {rank} {count * 4} {count} {' '.join(fields)}\n")
            sys.stdout.flush()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--series", default="")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--op", default="allreduce")
    p.add_argument("--sizes", default="8,1048576")
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-c", action="store_true")
    p.add_argument("--iters", type=float, default=1.0)
    args = p.parse_args()
    args.series = args.series or ("torch" if args.backend == "nccl" else "gloo")
    if args.nproc == 1:
        rank_main(0, args)  # no spawn: one process, as conftest's own rank
    else:
        mp.spawn(rank_main, args=(args,), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
