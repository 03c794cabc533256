"""A seeded regression whose batches a background thread prepares ahead of the training loop; the first layer
sizes itself from the first batch."""

import queue
import threading

import torch

torch.manual_seed(0)
ready: queue.Queue = queue.Queue(maxsize=2)


def prefetch(count: int) -> None:
    for _ in range(count):
        x = torch.randn(32, 16)
        ready.put((x, x.sum(dim=1, keepdim=True)))


steps = 6
loader = threading.Thread(target=prefetch, args=(steps,), daemon=True)
loader.start()
model = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    x, y = ready.get()
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
loader.join()
print(f"final loss {loss.item():.6f}")
