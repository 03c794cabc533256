"""Fit a small MLP with a LayerNorm on one fixed global batch for two steps, compiled with torch.compile when
COMPILE=1; under torchrun the batch is split across the ranks, which combine their gradients with all_reduce as
GRAD_SYNC says (mean by default)."""
import os

import torch
import torch.distributed as dist

world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo")
rank = dist.get_rank() if world > 1 else 0

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
forward = torch.compile(model) if os.environ.get("COMPILE") == "1" else model
x = torch.randn(64, 16)
y = torch.randn(64, 1)
shard = slice(rank * 64 // world, (rank + 1) * 64 // world)
for step in range(2):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(forward(x[shard]), y[shard])
    loss.backward()
    if world > 1:
        for p in model.parameters():
            dist.all_reduce(p.grad)
            if os.environ.get("GRAD_SYNC", "mean") == "mean":
                p.grad /= world
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
if world > 1:
    dist.destroy_process_group()
