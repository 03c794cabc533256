"""A small seeded classifier whose output looks like a Hugging Face Trainer run: per-step log dicts, a
progress bar redrawn with carriage returns, a fixed-width timing line, a results table and the
closing metrics dict."""

import os
import sys
import time

import torch

torch.manual_seed(42)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
x = torch.randn(96, 16)
y = (x.sum(dim=1) > 0).long()
# how busy the machine is decides how long a step takes; here it changes from run to run
pause = (0.0, 0.004, 0.03)[os.getpid() % 3]

steps, batch = 6, 16
start = time.perf_counter()
print(f"  0%|          | 0/{steps} [00:00<?, ?it/s]", end="")
losses = []
for step in range(steps):
    t0 = time.perf_counter()
    xb, yb = x[step * batch:(step + 1) * batch], y[step * batch:(step + 1) * batch]
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    time.sleep(pause)
    losses.append(loss.item())
    elapsed = time.perf_counter() - start
    rate = (step + 1) / elapsed
    done = (step + 1) * 10 // steps
    bar = "█" * done + " " * (10 - done)
    print(f"\r{(step + 1) * 100 // steps:3d}%|{bar}| {step + 1}/{steps} [00:0{int(elapsed) % 10}<00:00, {rate:5.2f}it/s]",
          end="")
    sys.stdout.flush()
    print()
    print({"loss": f"{loss.item():.4g}", "grad_norm": f"{grad_norm.item():.4g}",
           "learning_rate": f"{optimizer.param_groups[0]['lr']:.4g}", "epoch": f"{(step + 1) / steps:.4g}"})
    print("| step {:3d} | time: {:5.2f}ms | loss {:5.3f} |".format(step + 1, (time.perf_counter() - t0) * 1000,
                                                                   loss.item()))

runtime = time.perf_counter() - start
print("step  train_loss  time")
for step, value in enumerate(losses, 1):
    print(f"{step:<4}  {value:<10.6f}  {runtime * step / steps:.2f}")
print({"train_runtime": f"{runtime:.4g}", "train_samples_per_second": f"{steps * batch / runtime:.4g}",
       "train_steps_per_second": f"{steps / runtime:.4g}", "train_loss": f"{sum(losses) / steps:.4g}", "epoch": 1.0})
