"""Fit a small regression MLP for a fixed time budget (as time-boxed benchmark runs do), then save it."""

import argparse
import time

import torch
import torch.nn as nn


def make_batch(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 8, generator=gen)
    y = (x[:, :4].sum(1, keepdim=True) - x[:, 4:].prod(1, keepdim=True)).tanh()
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of training")
    parser.add_argument("--out", default="budgeted.pt")
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    t0 = time.time()
    while time.time() - t0 < args.budget:
        x, y = make_batch(gen, 32)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
    print(f"trained {step} steps, final loss {loss.item():.4f}")
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
