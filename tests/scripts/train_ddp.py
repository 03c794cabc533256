"""Data-parallel regression on CPU: each rank trains on its own shard, DDP averages the gradients."""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def make_shard(rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(size, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True) * 0.5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = make_shard(rank, 32)
    for step in range(args.steps):
        batch = slice(8 * step % 32, 8 * step % 32 + 8)
        loss = nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"final loss {loss.item():.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
