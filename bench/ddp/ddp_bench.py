"""PyTorch DDP side of bench_ddp: same network, init, batches, optimizer and gloo backend.
Run under `lockstep launch --nproc-per-node 2 -- /usr/bin/python3 bench/ddp/ddp_bench.py ...`
(or torchrun); prints one JSON line on rank 0, with the same fields as bench_ddp's."""
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

# Linear widths; "cnn" is the linear head of examples/fashion_mnist's CNN.
WIDTHS = {"small": [784, 512, 256, 10], "25m": [784, 4096, 4096, 1024, 10], "cnn": [64 * 5 * 5, 128, 10]}


class Net(nn.Module):
    """bench_ddp's NetImpl: layers created in forward order, so both sides draw the same weights."""

    def __init__(self, model):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)] if model == "cnn" else [])
        widths = WIDTHS[model]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        if len(self.convs):
            x = x.view(x.size(0), 1, 28, 28)
            for conv in self.convs:
                x = F.max_pool2d(F.relu(conv(x)), 2)
            x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="small", choices=WIDTHS)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first, at least 1")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--gradient-as-bucket-view", default="true")
    a = p.parse_args()
    if a.warmup < 1 or a.steps < 1:
        p.error("--warmup and --steps must be at least 1 (the first step ends the start-up)")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net(a.model)
    ddp = nn.parallel.DistributedDataParallel(
        net, bucket_cap_mb=a.bucket_cap_mb, gradient_as_bucket_view=a.gradient_as_bucket_view == "true")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator()
    g.manual_seed(1000 + rank)
    xs, ys = [], []
    for _ in range(8):
        xs.append(torch.randn(a.batch, 784, generator=g))
        ys.append(torch.randint(10, (a.batch,), generator=g))
    loss_value = 0.0

    def step(i):
        nonlocal loss_value
        loss = F.cross_entropy(ddp(xs[i % 8]), ys[i % 8])
        opt.zero_grad()
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
    rss = torch.zeros(dist.get_world_size(), dtype=torch.float64)
    rss[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    dist.all_reduce(rss)
    if rank == 0:
        print(json.dumps({"impl": "pytorch", "model": a.model, "world_size": dist.get_world_size(),
                          "steps": a.steps, "batch": a.batch, "steps_per_s": a.steps / seconds,
                          "loss": loss.item(), "first_step_unix": first_step_unix,
                          "peak_rss_mb": rss.tolist()}), flush=True)
    # torch 1.13 on Python 3.11 can hang joining ProcessGroupGloo's threads at interpreter exit
    # (seen here: destroy_process_group and exit both wait on the GIL forever); leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
