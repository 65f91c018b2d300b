"""torch 2.x against a gocoll-store server: the client API tour and a
two-rank gloo init_process_group + all_reduce (explicit store= and env://
with TORCHELASTIC_USE_AGENT_STORE=1). Run by scripts/store-gpu-run.sh."""
import datetime, os, subprocess, sys, time

HOST, PORT = sys.argv[1], int(sys.argv[2])
TD = datetime.timedelta


def rank_main(mode, rank):
    import torch, torch.distributed as dist
    if mode == "store":
        s = dist.TCPStore(HOST, PORT, 2, False, TD(seconds=60))
        dist.init_process_group("gloo", store=s, rank=rank, world_size=2, timeout=TD(seconds=60))
    else:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=2, timeout=TD(seconds=60))
    t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    dist.all_reduce(t)
    g = dist.new_group([0, 1])
    u = torch.ones(4) * (rank + 1)
    dist.all_reduce(u, group=g)
    dist.barrier()
    print(f"rank {rank} mode {mode}: all_reduce -> {t.tolist()} subgroup -> {u.tolist()}", flush=True)
    ok = t.tolist() == [3.0, 30.0] and u.tolist() == [3.0] * 4
    dist.destroy_process_group()
    sys.exit(0 if ok else 3)


def api_tour():
    import torch, torch.distributed as dist
    print("torch", torch.__version__, flush=True)
    c = dist.TCPStore(HOST, PORT, None, False, TD(seconds=30), wait_for_workers=False)
    res = []
    def chk(name, got, want):
        res.append(got == want)
        print(f"  {name}: {got!r}" + ("" if got == want else f"  MISMATCH want {want!r}"), flush=True)
    c.set("k1", b"v1"); chk("get", c.get("k1"), b"v1")
    chk("add", c.add("ctr", 5), 5); chk("add-2", c.add("ctr", -2), 3); chk("get ctr", c.get("ctr"), b"3")
    chk("cas match", c.compare_set("k1", "v1", "v2"), b"v2")
    chk("cas mismatch", c.compare_set("k1", "nope", "zz"), b"v2")
    chk("cas absent+empty", c.compare_set("absent", "", "new"), b"new")
    chk("cas absent+x", c.compare_set("absent2", "x", "y"), b"x")
    chk("delete", c.delete_key("k1"), True); chk("delete again", c.delete_key("k1"), False)
    chk("check", c.check(["ctr"]), True); chk("check missing", c.check(["ctr", "missing"]), False)
    try:
        c.wait(["missing"], TD(milliseconds=300)); chk("wait timeout", "no error", "error")
    except Exception as e:
        print(f"  wait timeout: {type(e).__name__}: {str(e).splitlines()[0][:80]}", flush=True)
        res.append("timeout" in str(e))
    c.append("ap", "x"); c.append("ap", "yz"); chk("append", c.get("ap"), b"xyz")
    c.multi_set(["m1", "m2"], ["a", "bb"]); chk("multi_get", c.multi_get(["m1", "m2"]), [b"a", b"bb"])
    c.queue_push("q", b"e1"); c.queue_push("q", b"e2")
    chk("queue_len", c.queue_len("q"), 2)
    chk("queue_pop", c.queue_pop("q", block=False), b"e1")
    chk("queue_pop blocking", c.queue_pop("q"), b"e2")
    try:
        c.queue_pop("q", block=False); chk("queue empty", "no error", "error")
    except Exception as e:
        chk("queue empty", type(e).__name__, type(e).__name__)
    chk("list_keys", sorted(c.list_keys()), sorted(["ctr", "absent", "ap", "m1", "m2"]))
    c2 = c.clone(); c2.set("cl", "1"); chk("clone", c.get("cl"), b"1")
    chk("num_keys", c.num_keys(), 6)
    return all(res)


if __name__ == "__main__":
    if len(sys.argv) > 3:
        rank_main(sys.argv[3], int(sys.argv[4]))
    ok = api_tour()
    for mode in ("store", "env"):
        env = dict(os.environ, MASTER_ADDR=HOST, MASTER_PORT=str(PORT), TORCHELASTIC_USE_AGENT_STORE="1",
                   TORCHELASTIC_RESTART_COUNT="0", GLOO_SOCKET_IFNAME="lo")
        t0 = time.time()
        ps = [subprocess.Popen([sys.executable, __file__, HOST, str(PORT), mode, str(r)], env=env) for r in range(2)]
        rcs = [p.wait(timeout=120) for p in ps]
        print(f"mode {mode}: rank exit codes {rcs} in {time.time() - t0:.1f}s", flush=True)
        ok = ok and rcs == [0, 0]
    print("RESULT", "PASS" if ok else "FAIL", flush=True)
    sys.exit(0 if ok else 1)
