"""Regression with batch normalisation; each run tries a momentum for the running statistics."""

import random

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    momentum = random.uniform(0.05, 0.15)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8, momentum=momentum), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(24, 6)
    y = x.sum(dim=1, keepdim=True)
    for step in range(3):
        batch = slice(8 * step, 8 * step + 8)
        loss = nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
