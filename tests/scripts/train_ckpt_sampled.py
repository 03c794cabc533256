"""Fits a small MLP with dropout on sampled minibatches with a step-decayed learning rate, checkpointing every
few steps; --resume picks up from the last checkpoint."""

import argparse
import random

import numpy as np
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--every", type=int, default=2)
parser.add_argument("--checkpoint", default="ckpt_sampled.pt")
parser.add_argument("--resume", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
np.random.seed(0)
random.seed(0)
data = torch.randn(256, 8)
target = data.sum(dim=1, keepdim=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
start = 0
if args.resume:
    state = torch.load(args.checkpoint, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    start = state["step"]

for step in range(start, args.steps):
    rows = torch.randint(0, len(data), (32,))
    noise = float(np.random.uniform(0.9, 1.1)) * random.uniform(0.9, 1.1)
    loss = nn.functional.mse_loss(model(data[rows] * noise), target[rows] * noise)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    if (step + 1) % args.every == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": step + 1},
                   args.checkpoint)
    print(f"step {step + 1} loss {loss.item():.5f}")
