"""Trains a small classifier with batch norm and dropout, scores a held-out batch, then trains on."""

import hashlib

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 20)
    y = torch.randint(0, 3, (64,))
    held_out = torch.randn(40, 20)

    def train(steps: int) -> None:
        model.train()
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"loss {loss.item()!r}")

    train(3)
    model.eval()
    with torch.no_grad():
        print("held-out", hashlib.sha256(model(held_out).numpy().tobytes()).hexdigest()[:16])
    train(2)
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().numpy().tobytes())
    print("state", digest.hexdigest()[:16], "next draw", torch.rand(1).item())


if __name__ == "__main__":
    main()
