"""A seeded regression that evaluates and checkpoints after every step, through a handle it opens itself
(`with open(ckpt.pt, "wb") as f: torch.save(..., f)`), as many training loops do.

ARGS: the number of steps (4)."""

import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 4
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(steps):
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    with torch.no_grad():
        print(f"step {step} eval loss {nn.functional.mse_loss(model(x), y).item():.6f}")
    with open("ckpt.pt", "wb") as f:
        torch.save({"step": step, "model": model.state_dict()}, f)
