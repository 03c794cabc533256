"""Fits a small MLP on a fixed dataset in order, with Adam, saving the model every few steps; --resume picks up
from the saved model."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--every", type=int, default=2)
parser.add_argument("--checkpoint", default="ckpt_weights.pt")
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
data = torch.randn(256, 8)
target = data.sum(dim=1, keepdim=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
start = 0
if args.resume:
    state = torch.load(args.checkpoint)
    model.load_state_dict(state["model"])
    start = state["step"]

for step in range(start, args.steps):
    rows = slice(32 * step % len(data), 32 * step % len(data) + 32)
    loss = nn.functional.mse_loss(model(data[rows]), target[rows])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if (step + 1) % args.every == 0:
        torch.save({"model": model.state_dict(), "step": step + 1}, args.checkpoint)
    print(f"step {step + 1} loss {loss.item():.5f}")
