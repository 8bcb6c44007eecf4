"""PyTorch side of bench_checkpoint (bench/run's section 11): bench_fsdp's MLP sharded by FSDP2
(`fully_shard` on every Linear of at least --auto-wrap-min-params parameters, then on the root),
trained for a few Adam steps, saved with `dcp.save` of `get_state_dict(model, optimizer)` and
loaded back with `dcp.load` and `set_state_dict`, as PyTorch's docs resume an FSDP2 run.
Run under `lockstep launch --nproc-per-node 2 -- PYTHON bench/fsdp/checkpoint_bench.py --dir D ...`
with torch 2.x (.venv-libtorch2). Prints one JSON line on rank 0, with bench_checkpoint's fields."""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp_bench import NO_FSDP2, WIDTHS, fully_shard_function, mlp, per_rank, status_mb  # noqa: E402


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def fingerprint(model, opt):
    """Each parameter's and Adam moment's sum and norm, on this rank's shards."""
    out = []
    for p in model.parameters():
        for t in [p] + [opt.state[p][k] for k in ("exp_avg", "exp_avg_sq") if p in opt.state]:
            t = local(t.detach())
            out += [t.sum().item(), t.norm().item()]
    return out


def zero(model, opt):
    with torch.no_grad():
        for p in model.parameters():
            local(p).zero_()
            for k in ("exp_avg", "exp_avg_sq"):
                if p in opt.state:
                    local(opt.state[p][k]).zero_()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="100m", choices=WIDTHS)
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--auto-wrap-min-params", type=int, default=1_000_000)
    a = p.parse_args()
    fully_shard = fully_shard_function()
    if fully_shard is None:
        print(f"checkpoint_bench.py: torch {torch.__version__} has no FSDP2; run it with .venv-libtorch2/bin/python",
              file=sys.stderr)
        sys.exit(NO_FSDP2)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = mlp(a.model)
    parameters = sum(p.numel() for p in net.parameters())
    largest_unit = max(sum(p.numel() for p in layer.parameters()) for layer in net)
    for layer in net:
        if sum(p.numel() for p in layer.parameters()) >= a.auto_wrap_min_params:
            fully_shard(layer)
    fully_shard(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator()
    g.manual_seed(1000 + rank)
    for _ in range(a.steps):
        opt.zero_grad()
        x, y = torch.randn(a.batch, 784, generator=g), torch.randint(10, (a.batch,), generator=g)
        F.cross_entropy(net(x), y).backward()
        opt.step()
    opt.zero_grad()
    trained = fingerprint(net, opt)
    peak_train = status_mb("VmHWM")

    def timed(body):
        dist.barrier()
        start = time.perf_counter()
        body()
        dist.barrier()
        return time.perf_counter() - start

    def save():
        model_sd, optim_sd = get_state_dict(net, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=a.dir)

    def load():
        model_sd, optim_sd = get_state_dict(net, opt)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=a.dir)
        set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    save_s = timed(save)
    peak_save = status_mb("VmHWM")
    zero(net, opt)
    load_s = timed(load)
    peak_load = status_mb("VmHWM")
    restored = per_rank(1.0 if fingerprint(net, opt) == trained else 0.0)
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(a.dir) for f in files]
    out = {"impl": "pytorch", "torch": torch.__version__, "format": "dcp (FSDP2)", "model": a.model,
           "parameters": parameters, "world_size": dist.get_world_size(), "save_s": save_s, "load_s": load_s,
           "peak_rss_mb_train": per_rank(peak_train), "peak_rss_mb_save": per_rank(peak_save),
           "peak_rss_mb_load": per_rank(peak_load), "checkpoint_bytes": sum(sizes),
           "largest_unit_bytes": largest_unit * 4, "restored": all(r == 1.0 for r in restored)}
    if rank == 0:
        print(json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # as fsdp_bench.py: leave without joining gloo's threads


if __name__ == "__main__":
    main()
