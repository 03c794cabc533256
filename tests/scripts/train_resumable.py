"""Trains a small regressor and writes a checkpoint it can resume from after every epoch."""

import random

import numpy as np
import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(2):
        x = torch.randn(16, 4)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                    "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                            "python": random.getstate()}}, "checkpoint.pt")
    print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
