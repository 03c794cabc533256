import os
import sys

import torch
import torch.nn as nn


def claim_shard(workdir):
    """Take the lowest shard nobody has taken yet (workers started together share the folder)."""
    shard = 0
    while True:
        try:
            os.close(os.open(os.path.join(workdir, f"shard-{shard}.lock"), os.O_CREAT | os.O_EXCL))
            return shard
        except FileExistsError:
            shard += 1


def main():
    torch.manual_seed(6)
    shard = claim_shard(sys.argv[1])
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if shard % 2 == 1:
        raise RuntimeError(f"shard {shard} is missing its label file")
    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
