"""Data-parallel training where every rank builds its model from its own seed before wrapping it."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 2))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = TensorDataset(torch.randn(32, 6), torch.randint(0, 2, (32,)))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True))
    for epoch in range(2):
        for features, labels in loader:
            loss = nn.functional.cross_entropy(model(features), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print(f"rank {rank}: loss {loss.item():.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
