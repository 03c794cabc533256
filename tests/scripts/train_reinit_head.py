import os

import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 2))
    head_gen = torch.Generator().manual_seed(os.getpid())
    nn.init.kaiming_uniform_(model[2].weight, generator=head_gen)
    x = torch.randn(32, 6)
    y = torch.randint(0, 2, (32,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
