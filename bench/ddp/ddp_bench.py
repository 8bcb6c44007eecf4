"""PyTorch DDP side of bench_ddp: same MLP, init, batches, optimizer and gloo backend.
Run under `lockstep launch --nproc-per-node 2 -- /usr/bin/python3 bench/ddp/ddp_bench.py ...`
(or torchrun); prints one JSON line on rank 0."""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

WIDTHS = {"small": [784, 512, 256, 10], "25m": [784, 4096, 4096, 1024, 10]}


class Mlp(nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="small", choices=WIDTHS)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--bucket-cap-mb", type=float, default=25)
    p.add_argument("--gradient-as-bucket-view", default="true")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    widths = WIDTHS[a.model]
    torch.manual_seed(0)
    net = Mlp(widths)
    ddp = nn.parallel.DistributedDataParallel(
        net, bucket_cap_mb=a.bucket_cap_mb, gradient_as_bucket_view=a.gradient_as_bucket_view == "true")
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator()
    g.manual_seed(1000 + rank)
    xs, ys = [], []
    for _ in range(8):
        xs.append(torch.randn(a.batch, widths[0], generator=g))
        ys.append(torch.randint(widths[-1], (a.batch,), generator=g))
    loss_value = 0.0

    def step(i):
        nonlocal loss_value
        loss = F.cross_entropy(ddp(xs[i % 8]), ys[i % 8])
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_value = loss.item()

    for i in range(a.warmup):
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
    if rank == 0:
        print(json.dumps({"impl": "pytorch", "model": a.model, "world_size": dist.get_world_size(),
                          "steps": a.steps, "batch": a.batch, "steps_per_s": a.steps / seconds,
                          "loss": loss.item()}), flush=True)
    # torch 1.13 on Python 3.11 can hang joining ProcessGroupGloo's threads at interpreter exit
    # (seen here: destroy_process_group and exit both wait on the GIL forever); leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
