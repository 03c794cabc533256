"""Data-parallel training in which rank 0 alone clamps its head's weight once, outside DDP: its replica drifts.

ARGS: the number of steps (2,000), and a step after which rank 0 saves its model to checkpoint.pt (none)."""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main(steps: int, save_after: int | None) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x = torch.randn(4, 4, generator=gen)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step == 1:
            with torch.no_grad():
                model.module[2].weight.clamp_(-0.05, 0.05)
        if rank == 0 and step == save_after:
            torch.save(model.state_dict(), "checkpoint.pt")
        if rank == 0 and step % 100 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, int(sys.argv[2]) if len(sys.argv) > 2 else None)
