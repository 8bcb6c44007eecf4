"""Makes a Lockstep Trainer checkpoint resumable in PyTorch Lightning 2.x (`trainer.fit(model, ckpt_path=OUT)`).

  python tools/python/lockstep_to_lightning.py lockstep_logs/version_0/checkpoints/last.ckpt lightning.ckpt \\
      --rename net.=

Lockstep's checkpoint is a dict that torch.load reads (weights_only=True too), with "state_dict" and
"optimizer_states" already in Python's layout (torch.optim's state_dict: per-parameter state by
parameter order, param groups). Lightning's resume also reads what this adds: the LightningModule's
names (--rename, FROM=TO prefix rules as Lockstep's --init-weights-rename), each LR scheduler's state
(its step count), the loops' progress at the start of the next epoch, and the Lightning version;
hyper_parameters (the module's hparams()) carry over as they are.
Lockstep's own callbacks' state and RNG state are left out (docs/user-guide.md,
"Lightning checkpoints", has the table). Exit code 2 with a message for a checkpoint it cannot convert.
"""
import argparse
import os
import sys


def fail(message):
    print(f"lockstep_to_lightning: {message}", file=sys.stderr)
    sys.exit(2)


def renamed(state, rules):
    """state's names with the first matching FROM=TO prefix rule applied, as Lockstep's KeyMap."""
    pairs = []
    for rule in filter(None, rules.split(",")):
        if "=" not in rule:
            fail(f"--rename rule '{rule}' has no '=': write FROM=TO, e.g. net.= to strip net.")
        pairs.append(rule.split("=", 1))
    out = {}
    for key, value in state.items():
        new = next((to + key[len(frm):] for frm, to in pairs if key.startswith(frm)), key)
        if new in out:
            fail(f"--rename {rules} turns two names into '{new}'; give rules that keep them apart")
        out[new] = value
    return out


def progress(n, *fields):
    return {field: n for field in fields}


def fit_loop(next_epoch, global_step):
    """Lightning's fit loop at the start of epoch `next_epoch`, after `global_step` optimizer steps.
    Lightning's _Loop.load_state_dict skips the keys it does not find, so only these are given."""
    epochs = progress(next_epoch, "ready", "started", "processed", "completed")
    steps = progress(global_step, "ready", "completed")
    zero_grads = progress(global_step, "ready", "started", "completed")
    return {
        "epoch_progress": {"total": dict(epochs), "current": dict(epochs)},
        "epoch_loop.state_dict": {"_batches_that_stepped": global_step},
        "epoch_loop.automatic_optimization.optim_progress": {
            "optimizer": {"step": {"total": dict(steps), "current": dict(steps)},
                          "zero_grad": {"total": dict(zero_grads), "current": dict(zero_grads)}}},
    }


def lightning_version():
    try:
        import lightning
        return lightning.__version__
    except ImportError:
        import pytorch_lightning
        return pytorch_lightning.__version__


def convert(ckpt, rules, intervals):
    for key in ("state_dict", "optimizer_states", "epoch", "global_step", "loops"):
        if key not in ckpt:
            fail(f"the checkpoint lacks \"{key}\": pass one that Lockstep's Trainer wrote (a last.ckpt)")
    loops = ckpt["loops"]
    if loops.get("next_batch", 0) != 0:
        fail(f"the checkpoint was written mid-epoch (epoch {loops['next_epoch']}, after {loops['next_batch']} "
             "batches), and Lightning resumes a loader that keeps no state only at an epoch's start: convert a "
             "checkpoint written at the end of an epoch")
    steps = ckpt.get("lr_schedulers", {})
    optimizer = ckpt["optimizer_states"][0] if ckpt["optimizer_states"] else {"param_groups": []}
    last_lr = [group["lr"] for group in optimizer["param_groups"]]
    schedulers = []
    for interval in intervals:
        count = steps.get("epoch_steps" if interval == "epoch" else "step_steps", 0)
        # LRScheduler.load_state_dict updates the scheduler's attributes with these; LambdaLR's and
        # MultiplicativeLR's also take lr_lambdas (None: the functions the module configured stay).
        schedulers.append({"last_epoch": count, "_step_count": count + 1, "_last_lr": last_lr, "_is_initial": False,
                           "lr_lambdas": [None] * len(last_lr)})
    return {
        "epoch": ckpt["epoch"],
        "global_step": ckpt["global_step"],
        "state_dict": renamed(ckpt["state_dict"], rules),
        "optimizer_states": ckpt["optimizer_states"],
        "lr_schedulers": schedulers,
        "loops": {"fit_loop": fit_loop(loops["next_epoch"], ckpt["global_step"])},
        "callbacks": {},
        # Typed as hparams() set them; Lightning's load_from_checkpoint passes the ones its
        # __init__ takes, and fit(ckpt_path=...) keeps the module's own, as Lockstep's resume does.
        "hyper_parameters": ckpt.get("hyper_parameters", {}),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("lockstep_ckpt", help="a checkpoint that Lockstep's Trainer wrote (e.g. last.ckpt)")
    p.add_argument("out", help="the Lightning .ckpt to write")
    p.add_argument("--rename", default="", help="FROM=TO,...: prefix rules from Lockstep's names to the "
                   "LightningModule's (net.= strips net.)")
    p.add_argument("--scheduler-interval", action="append", choices=["epoch", "step"],
                   help="the interval of each LR scheduler configure_optimizers returns, in order (default: one, "
                   "epoch); Lockstep counts the steps of each interval")
    args = p.parse_args()
    renamed({}, args.rename)  # a bad rule fails before torch's seconds of loading
    import torch

    try:
        ckpt = torch.load(args.lockstep_ckpt, map_location="cpu", weights_only=True)
    except Exception as e:  # a missing, damaged or foreign file: one message
        fail(f"cannot read {args.lockstep_ckpt}: {e}")
    converted = convert(ckpt, args.rename, args.scheduler_interval or ["epoch"])
    converted["pytorch-lightning_version"] = lightning_version()
    temporary = f"{args.out}.tmp.{os.getpid()}"  # renamed over OUT when whole: never a half-written file
    try:
        torch.save(converted, temporary)
        os.replace(temporary, args.out)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


if __name__ == "__main__":
    main()
