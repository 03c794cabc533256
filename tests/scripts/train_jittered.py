import random

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class JitteredWaves(Dataset):
    def __init__(self, n=96, length=32):
        t = torch.linspace(0, 1, length)
        self.waves = torch.stack([torch.sin(2 * np.pi * (1 + i % 4) * t) for i in range(n)])
        self.labels = torch.tensor([i % 4 for i in range(n)])
        self.jitter = None

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.jitter is None:
            self.jitter = np.random.default_rng()
        scale = float(self.jitter.uniform(0.9, 1.1))
        return self.waves[i] * scale, self.labels[i]


def main():
    random.seed(0)
    torch.manual_seed(0)
    classes = list(range(4))
    random.shuffle(classes)
    loader = DataLoader(JitteredWaves(), batch_size=16, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    for waves, labels in loader:
        targets = torch.tensor(classes)[labels]
        loss = nn.functional.cross_entropy(model(waves), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
