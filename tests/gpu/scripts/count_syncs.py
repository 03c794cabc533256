"""Train a few steps without any host synchronisation of our own, counting the ones that happen.

Prints one line per step: `step N syncs K`, K being the synchronising CUDA calls made during that
step (by anything running in this process), as torch's sync debug mode reports them.
"""
import warnings

import torch
import torch.nn as nn

seen = []


def count(message, category, filename, lineno, file=None, line=None):
    if "synchronizing" in str(message):
        seen.append(str(message))


def main():
    torch.manual_seed(0)
    device = "cuda"
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(256, 64, device=device)
    y = torch.randn(256, 1, device=device)
    warnings.simplefilter("always")
    warnings.showwarning = count
    torch.cuda.set_sync_debug_mode("warn")
    counts = []
    for step in range(6):
        before = len(seen)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        counts.append(len(seen) - before)
    torch.cuda.set_sync_debug_mode("default")
    for step, k in enumerate(counts):
        print(f"step {step} syncs {k}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
