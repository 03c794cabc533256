"""Activity tagger for accelerometer windows: a small MLP backbone with a classification head.

Mixed precision (bf16 autocast + GradScaler), gradient accumulation, separate optimizers and LR
schedules for backbone and head, the backbone frozen for the first epoch, a validation pass after
every epoch and a checkpoint per epoch.
"""

import argparse
import random
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

CLASSES = 4
WINDOW = 24


class Windows(Dataset):
    """Synthetic three-axis accelerometer windows, augmented with jitter, scaling and time shifts."""

    def __init__(self, n: int, seed: int, augment: bool) -> None:
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, CLASSES, n)
        t = np.linspace(0, 1, WINDOW, dtype=np.float32)
        freq = 1.0 + self.labels[:, None].astype(np.float32)
        base = np.sin(2 * np.pi * freq * t)[:, None, :] * np.array([1.0, 0.5, 0.25], dtype=np.float32)[:, None]
        self.x = (base + 0.1 * rng.standard_normal(base.shape)).astype(np.float32)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.x[i].copy()
        if self.augment:
            x = x * np.float32(np.random.uniform(0.9, 1.1))
            x = x + np.random.normal(0, 0.02, x.shape).astype(np.float32)
            x = np.roll(x, random.randint(-2, 2), axis=1)
        return torch.from_numpy(x.reshape(-1)), int(self.labels[i])


def seed_worker(worker_id: int) -> None:
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class Tagger(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Linear(3 * WINDOW, hidden), nn.GELU(), nn.LayerNorm(hidden),
            nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(0.1),
        )
        self.neck = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.backbone(x)))


def set_trainable(model: Tagger, names: list[str], flag: bool) -> None:
    for name in names:
        for p in getattr(model, name).parameters():
            p.requires_grad_(flag)


def evaluate(model: Tagger, loader: DataLoader) -> tuple[float, float]:
    model.eval()
    total, correct, loss = 0, 0, 0.0
    with torch.no_grad():
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
            loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    return loss / total, correct / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accumulate", type=int, default=2)
    parser.add_argument("--augment-from", type=int, default=0, help="first epoch with augmented windows")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoints", default="checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_set = Windows(128, args.seed, augment=True)
    train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                       num_workers=args.workers, worker_init_fn=seed_worker,
                       generator=torch.Generator().manual_seed(args.seed))
    val = DataLoader(Windows(48, args.seed + 1, augment=False), batch_size=args.batch_size)

    model = Tagger()
    backbone_params = list(model.backbone.parameters())
    other_params = list(model.neck.parameters()) + list(model.head.parameters())
    opt_backbone = torch.optim.SGD(backbone_params, lr=0.05, momentum=0.9)
    opt_head = torch.optim.AdamW(other_params, lr=3e-3, weight_decay=0.01)
    sched_backbone = torch.optim.lr_scheduler.StepLR(opt_backbone, step_size=4, gamma=0.5)
    sched_head = torch.optim.lr_scheduler.CosineAnnealingLR(opt_head, T_max=args.epochs * 4)
    scaler = torch.amp.GradScaler("cpu")
    out = Path(args.checkpoints)
    out.mkdir(exist_ok=True)

    frozen = ["backbone"]
    set_trainable(model, frozen, False)
    for epoch in range(args.epochs):
        if epoch == 1:
            set_trainable(model, frozen, True)
        train_set.augment = epoch >= args.augment_from
        for i, (x, y) in enumerate(train):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x).float(), y) / args.accumulate
            scaler.scale(loss).backward()
            if (i + 1) % args.accumulate == 0:
                scaler.step(opt_head)
                if epoch >= 1:
                    scaler.step(opt_backbone)
                scaler.update()
                opt_head.zero_grad(set_to_none=True)
                opt_backbone.zero_grad(set_to_none=True)
                sched_head.step()
                if epoch >= 1:
                    sched_backbone.step()
        val_loss, val_acc = evaluate(model, val)
        print(f"epoch {epoch} val_loss {val_loss:.5f} val_acc {val_acc:.3f}")
        torch.save({"epoch": epoch, "model": model.state_dict(), "opt_head": opt_head.state_dict(),
                    "opt_backbone": opt_backbone.state_dict(), "sched_head": sched_head.state_dict(),
                    "scaler": scaler.state_dict()}, out / f"epoch{epoch}.pt")


if __name__ == "__main__":
    main()
