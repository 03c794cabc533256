"""Data-parallel training where every rank builds its model from its own seed before wrapping it."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 2))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    features = torch.randn(16, 6)
    labels = torch.randint(0, 2, (16,))
    for epoch in range(3):
        loss = nn.functional.cross_entropy(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"rank {rank}: loss {loss.item():.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
