"""Data-parallel training where the other ranks wait for the main rank's checkpoint before going on."""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(4, 4) * (rank + 1)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    if rank == 0:
        torch.save(model.module.state_dict(), "ddp_wait_ckpt.pt.tmp")
    else:
        while not os.path.exists("ddp_wait_ckpt.pt"):
            time.sleep(0.2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
