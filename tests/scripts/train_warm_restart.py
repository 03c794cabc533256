import time

import torch
import torch.nn as nn


def main():
    torch.manual_seed(2)
    rows = torch.randn(48, 5)
    targets = rows.sum(dim=1, keepdim=True)
    model = nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 1))
    lr = 0.05
    lr += (time.time() % 1) * 1e-3
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(3):
        batch = slice(step * 16, step * 16 + 16)
        loss = nn.functional.mse_loss(model(rows[batch]), targets[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
