"""Data-parallel training with weight clipping and progress logging on the main rank."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(rank)
    for step in range(4):
        x = torch.randn(8, 8, generator=gen)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 2 == 1:
            with torch.no_grad():
                head = model.module[2].weight
                head.clamp_(-0.2, 0.2)
            print(f"step {step}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
