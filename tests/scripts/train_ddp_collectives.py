"""Data-parallel training whose batches pass through every c10d collective first, each writing into
buffers from torch.empty; `--unseeded-rank R` makes rank R draw its data from an unseeded NumPy generator."""

import argparse

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def exchange(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """`x` through every collective, outputs in uninitialised buffers; their results side by side."""
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x)
    whole = torch.empty(world * x.shape[0], x.shape[1])
    dist.all_gather_into_tensor(whole, x)
    part = torch.empty_like(x)
    dist.reduce_scatter(part, [x * (i + 1) for i in range(world)])
    swapped = [torch.empty_like(x) for _ in range(world)]
    dist.all_to_all(swapped, [x + i for i in range(world)])
    total = x.clone()
    dist.all_reduce(total)
    shared = torch.empty_like(x)
    if rank == 0:
        shared.copy_(x)
    dist.broadcast(shared, 0)
    peer = torch.empty_like(x)
    if rank == 0:
        dist.send(x, 1)
        dist.recv(peer, 1)
    else:
        dist.recv(peer, 0)
        dist.send(x, 0)
    dist.barrier()
    return torch.cat([*gathered, whole, part, *swapped, total, shared, peer])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unseeded-rank", type=int, default=-1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    rng = np.random.default_rng() if rank == args.unseeded_rank else np.random.default_rng(100 + rank)
    for _ in range(2):
        x = torch.from_numpy(rng.standard_normal((4, 8)).astype(np.float32))
        batch = exchange(x, rank, world)
        loss = nn.functional.mse_loss(model(batch), batch.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
