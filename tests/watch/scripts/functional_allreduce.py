"""Two gloo ranks averaging their gradients by hand with torch.distributed's functional collectives
(`_functional_collectives.all_reduce`, whose result waits on `_c10d_functional.wait_tensor`): no DDP.

ARGS: the number of steps (3)."""

import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn


def main(steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=gen)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        for p in model.parameters():
            p.grad = funcol.all_reduce(p.grad, "avg", dist.group.WORLD)
        optimizer.step()
    print(f"rank {rank} weight sum {model.weight.sum().item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
