"""PyTorch side of bench_fsdp: the same MLP (an nn.Sequential of Linear and ReLU), weights, batches,
Adam and gloo on the CPU, sharded by FSDP2 (`fully_shard` on every Linear of at least
--auto-wrap-min-params parameters, then on the root) or by DDP with ZeroRedundancyOptimizer.
Run under `lockstep launch --nproc-per-node 2 -- PYTHON bench/fsdp/fsdp_bench.py --sharding FSDP2 ...`
(or torchrun) with torch 2.x (.venv-libtorch2): Debian's torch 1.13 has no FSDP2, and the
program says so and exits 3. Prints one JSON line on rank 0, with bench_fsdp's fields."""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# Linear widths, as bench_fsdp's.
WIDTHS = {"25m": [784, 4096, 4096, 1024, 10], "100m": [784] + [4096] * 7 + [10], "100m-wide": [784, 8192, 8192, 4096, 10]}
NO_FSDP2 = 3  # exit code: this torch has no fully_shard


def fully_shard_function():
    """torch.distributed.fsdp.fully_shard (2.6 on), or its earlier home (2.4, 2.5); None before.
    Debian's torch 1.13 cannot even import torch.distributed.fsdp on Python 3.11 (a dataclass
    error), so older versions are not imported."""
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):
        return None
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def mlp(model):
    """bench_fsdp's NetImpl without its probes: Linears created in forward order, same weights."""
    widths = WIDTHS[model]
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def status_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB
    return 0.0


def per_rank(value):
    all_ = torch.zeros(dist.get_world_size(), dtype=torch.float64)
    all_[dist.get_rank()] = value
    dist.all_reduce(all_)
    return all_.tolist()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="25m", choices=WIDTHS)
    p.add_argument("--sharding", default="FSDP2", choices=["FSDP2", "ZERO", "DDP"],
                   help="FSDP2: fully_shard per Linear and the root; ZERO: DDP with ZeroRedundancyOptimizer")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first, at least 1")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--auto-wrap-min-params", type=int, default=1_000_000)
    a = p.parse_args()
    if a.warmup < 1 or a.steps < 1:
        p.error("--warmup and --steps must be at least 1 (the first step ends the start-up)")
    fully_shard = fully_shard_function()
    if a.sharding == "FSDP2" and fully_shard is None:
        print(f"fsdp_bench.py: torch {torch.__version__} has no FSDP2 (fully_shard, torch 2.4 and later); "
              "run it with .venv-libtorch2/bin/python (scripts/test-libtorch2 installs it)", file=sys.stderr)
        sys.exit(NO_FSDP2)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    floor_mb = status_mb("VmRSS")
    torch.manual_seed(0)
    net = mlp(a.model)
    parameters = sum(p.numel() for p in net.parameters())
    if a.sharding == "FSDP2":
        for layer in net:
            if sum(p.numel() for p in layer.parameters()) >= a.auto_wrap_min_params:
                fully_shard(layer)
        fully_shard(net)
        model, opt = net, torch.optim.Adam(net.parameters(), lr=1e-3)
    elif a.sharding == "ZERO":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        model = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=True)
        opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        model = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=True)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator()
    g.manual_seed(1000 + rank)
    xs, ys = [], []
    for _ in range(8):
        xs.append(torch.randn(a.batch, 784, generator=g))
        ys.append(torch.randint(10, (a.batch,), generator=g))
    loss_value = 0.0

    def step(i):
        nonlocal loss_value
        opt.zero_grad()  # first, as bench_fsdp does
        loss = F.cross_entropy(model(xs[i % 8]), ys[i % 8])
        loss.backward()
        opt.step()
        loss_value = loss.item()

    step(0)
    first_step_unix = time.time()
    for i in range(1, a.warmup):
        step(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(a.warmup, a.warmup + a.steps):
        step(i)
    dist.barrier()
    seconds = time.perf_counter() - start
    loss = torch.tensor([loss_value], dtype=torch.float64)
    dist.all_reduce(loss)
    loss /= dist.get_world_size()
    peak = per_rank(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)  # KiB on Linux
    floors = per_rank(floor_mb)
    shmem = per_rank(status_mb("RssShmem"))
    if rank == 0:
        print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "sharding": a.sharding, "model": a.model,
                          "parameters": parameters, "world_size": dist.get_world_size(), "steps": a.steps,
                          "batch": a.batch, "steps_per_s": a.steps / seconds, "loss": loss.item(),
                          "first_step_unix": first_step_unix, "transport": "gloo", "floor_rss_mb": floors,
                          "peak_rss_mb": peak, "shmem_rss_mb_at_end": shmem}), flush=True)
    # torch 1.13 on Python 3.11 can hang joining ProcessGroupGloo's threads at interpreter exit
    # (ddp_bench.py); leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
