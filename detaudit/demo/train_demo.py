"""A small training script with one flaw: detaudit's demo audits it."""

import numpy as np
import torch
from torch import nn


def batches(n_steps: int, batch: int = 32):
    for _ in range(n_steps):
        x = np.random.randn(batch, 16).astype(np.float32)
        y = (x[:, :4].sum(axis=1) > 0).astype(np.int64)
        yield torch.from_numpy(x), torch.from_numpy(y)


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(batches(20)):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step:2d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
