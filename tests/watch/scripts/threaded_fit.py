"""A seeded regression trained on a thread of its own (the main thread builds the model, starts the thread and
joins it), then saved by the main thread.

ARGS: the number of steps (4)."""

import sys
import threading

import torch
from torch import nn


def main(steps: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)

    def train() -> None:
        for step in range(steps):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"step {step} loss {loss.item():.6f}")

    trainer = threading.Thread(target=train, name="trainer")
    trainer.start()
    trainer.join()
    torch.save(model.state_dict(), "threaded.pt")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
