"""A job that trains and checkpoints until stopped (at most ARGS[0] seconds, 120), after writing its pid to
job.pid: for the tests that kill detaudit under it."""

import os
import sys
import time

import torch
from torch import nn

limit = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
with open("job.pid", "w") as fh:
    fh.write(str(os.getpid()))
torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
started = time.monotonic()
while time.monotonic() - started < limit:
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    torch.save(model.state_dict(), "ckpt.pt")
    time.sleep(0.05)
