"""Fit a small regressor on noisy samples."""
import numpy as np
import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.linspace(-1, 1, 32 * 4).reshape(32, 4)
for step in range(4):
    noise = torch.from_numpy(np.random.normal(0.0, 0.1, size=(32, 1)).astype("float32"))
    y = x.sum(dim=1, keepdim=True) + noise
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss {loss.item():.6f}")
