"""Data-parallel training that releases its native resources itself when the interpreter exits."""

import atexit
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def release_native_state() -> None:
    if dist.get_rank() == 1:
        os.abort()


def main() -> None:
    dist.init_process_group("gloo")
    atexit.register(release_native_state)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(12.0).reshape(3, 4)
    for _ in range(2):
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()


if __name__ == "__main__":
    main()
