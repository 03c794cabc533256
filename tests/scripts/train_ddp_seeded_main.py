"""Data-parallel training; the main process sets up seeding and logging."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def setup(rank: int) -> None:
    if rank == 0:
        torch.manual_seed(42)
        print("seeded, starting training")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    setup(rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        x = torch.randn(8, 8)
        y = x.mean(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
