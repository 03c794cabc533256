import os

import torch
import torch.nn as nn


def main():
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    model.eval()
    scores = []
    with torch.no_grad():
        for batch in range(5):
            x = torch.linspace(-1, 1, 8 * 16).reshape(8, 16) * (batch + 1)
            scores.append(model(x).softmax(dim=1).max(dim=1).values.mean().item())
    print(f"scored {len(scores)} batches", flush=True)
    # leave without interpreter teardown: it takes seconds with big models loaded
    os._exit(0)


if __name__ == "__main__":
    main()
