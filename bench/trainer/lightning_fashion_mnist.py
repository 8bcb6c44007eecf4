"""PyTorch Lightning side of bench/run's trainer_vs_lightning: the job of
`build/bin/fashion_mnist --devices 2 --strategy ddp --max-epochs E --seed 0` in Lightning 2.6.

  .venv-libtorch2/bin/python bench/trainer/lightning_fashion_mnist.py --max-epochs 3

The same data (Fashion-MNIST's IDX files, pixels x/255 then (x - 0.2860) / 0.3530 in float32),
MLP 784-512-256-10 with ReLU (layers drawn in the same order after seed 0), Adam lr 1e-3, batch 64
per process, a DistributedSampler (seed 0, reshuffled every epoch), validation on the 10k test
set each epoch with sync_dist, 2 CPU processes under DDP (gloo), and the same learning rate per
epoch as Lockstep's StepLR(1, 0.5): LibTorch's StepLR does not decay on its first step, so
epoch e trains at lr * gamma^max(0, e - 1) (1e-3, 1e-3, 5e-4, ...), not Python StepLR's lr * gamma^e.
Rank 0 prints one JSON line: fit_s (wall time of trainer.fit, which also starts rank 1), steps,
steps_per_s (steps / fit_s), val_acc (final) and per epoch, the lr each epoch trained at, versions.

Checkpoints across the border (docs/user-guide.md, "Lightning checkpoints"): --checkpoint-dir DIR
saves DIR/last.ckpt after every epoch (ModelCheckpoint(save_last=True)), --ckpt-path resumes from
a .ckpt (Lightning's own, or one that tools/python/lockstep_to_lightning.py made from Lockstep's), and
--losses-file writes one line per training step, "epoch step lr loss" with the numbers as
float.hex(), which tests/tools/lightning_checkpoint_test.cpp compares with Lockstep's.
"""
import argparse
import gzip
import json
import logging
import os
import struct
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads; Lightning keeps a value already set

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

MEAN, STDDEV = 0.2860, 0.3530  # Lockstep's IdxDatasetOptions defaults (Fashion-MNIST)


def read_idx(directory, base):
    """An IDX file as a uint8 tensor; base.gz preferred over base, as Lockstep's IdxDataset."""
    path = os.path.join(directory, base)
    data = gzip.open(path + ".gz").read() if os.path.exists(path + ".gz") else open(path, "rb").read()
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).view(*dims)


class FashionMnist(Dataset):
    """Images kept as bytes and turned into floats through a 256-entry table, as Lockstep's."""

    def __init__(self, directory, prefix):
        self.images = read_idx(directory, f"{prefix}-images-idx3-ubyte").flatten(1)
        self.labels = read_idx(directory, f"{prefix}-labels-idx1-ubyte").long()
        self.table = (torch.arange(256, dtype=torch.float32) / 255.0 - MEAN) / STDDEV

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.table[self.images[i].long()], self.labels[i]

    def __getitems__(self, indices):
        """A whole batch in one gather (the DataLoader calls this instead of __getitem__ per example)."""
        index = torch.tensor(indices)
        return self.table[self.images[index].long()], self.labels[index]


def whole_batch(batch):
    return batch  # __getitems__ returned the stacked batch already


class Classifier(pl.LightningModule):
    def __init__(self, train, val, args):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 512), nn.Linear(512, 256), nn.Linear(256, 10)
        self.train_set, self.val_set, self.args = train, val, args
        self.lr_per_epoch, self.val_acc_per_epoch = [], []
        self.losses = None  # a file, with --losses-file
        # As most LightningModules do: its checkpoints then hold them (an AttributeDict).
        self.save_hyperparameters({"lr": args.lr, "lr_gamma": args.lr_gamma, "batch_size": args.batch_size})

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))

    def loader(self, dataset, batch_size, shuffle):
        sampler = DistributedSampler(dataset, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank,
                                     shuffle=shuffle, seed=self.args.seed)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=whole_batch)

    def train_dataloader(self):
        return self.loader(self.train_set, self.args.batch_size, True)  # Lightning calls set_epoch

    def val_dataloader(self):
        return self.loader(self.val_set, 256, False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if self.losses is not None:
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            self.losses.write(f"{self.current_epoch} {self.global_step} {float(lr).hex()} {loss.item().hex()}\n")
        self.log("train_loss", loss, prog_bar=True, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True, batch_size=len(y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True, prog_bar=True, batch_size=len(y))

    def on_train_epoch_start(self):
        self.lr_per_epoch.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def on_validation_end(self):
        if not self.trainer.sanity_checking:
            self.val_acc_per_epoch.append(self.trainer.callback_metrics["val_acc"].item())

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.args.lr)
        gamma = self.args.lr_gamma
        # LibTorch's StepLR(step_size 1): its first step() (after epoch 0) keeps the rate.
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: gamma ** max(0, epoch - 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "epoch"}}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="examples per batch on each process")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-gamma", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--accelerator", default="cpu", help="cpu, or cuda (scripts/gpu-check)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--default-root-dir", default=os.getcwd())
    p.add_argument("--limit-train-batches", type=int, default=None, help="batches per training epoch (all: none)")
    p.add_argument("--limit-val-batches", type=int, default=None, help="batches per validation (all: none)")
    p.add_argument("--checkpoint-dir", default=None, help="save last.ckpt here after every epoch")
    p.add_argument("--ckpt-path", default=None, help="resume from this .ckpt")
    p.add_argument("--losses-file", default=None, help="write each training step's epoch, step, lr and loss")
    args = p.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    pl.seed_everything(args.seed, verbose=False)
    train, val = FashionMnist(args.data_dir, "train"), FashionMnist(args.data_dir, "t10k")
    model = Classifier(train, val, args)
    callbacks = [] if args.checkpoint_dir is None else [ModelCheckpoint(dirpath=args.checkpoint_dir, save_last=True)]
    trainer = pl.Trainer(accelerator=args.accelerator, devices=args.devices,
                         strategy="ddp" if args.devices > 1 else "auto", max_epochs=args.max_epochs,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=args.checkpoint_dir is not None, callbacks=callbacks,
                         use_distributed_sampler=False, default_root_dir=args.default_root_dir,
                         limit_train_batches=args.limit_train_batches, limit_val_batches=args.limit_val_batches)
    if args.losses_file is not None and trainer.global_rank == 0:
        model.losses = open(args.losses_file, "w")
    started = time.perf_counter()
    trainer.fit(model, ckpt_path=args.ckpt_path)
    fit_s = time.perf_counter() - started
    if trainer.global_rank == 0:
        print(json.dumps({"impl": "lightning", "fit_s": fit_s, "steps": trainer.global_step,
                          "steps_per_s": trainer.global_step / fit_s, "epochs": trainer.current_epoch,
                          "world_size": trainer.world_size, "val_acc": trainer.callback_metrics["val_acc"].item(),
                          "val_acc_per_epoch": model.val_acc_per_epoch, "lr_per_epoch": model.lr_per_epoch,
                          "torch": torch.__version__, "lightning": pl.__version__}), flush=True)
    # As PyTorch's docs ask; without it Gloo's threads may outlive the interpreter and abort the
    # process at exit ("terminate called without an active exception", pytorch/pytorch#190489;
    # seen here once in 6 runs of torch 2.15, 2026-12-06), after the result.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
