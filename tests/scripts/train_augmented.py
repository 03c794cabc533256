import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class NoisySignals(Dataset):
    def __init__(self, n=96, length=32):
        t = torch.linspace(0, 1, length)
        self.signals = torch.stack([torch.sin(2 * np.pi * (1 + i % 4) * t) for i in range(n)])
        self.labels = torch.tensor([i % 4 for i in range(n)])
        self.rng = None

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if self.rng is None:
            self.rng = np.random.default_rng()
        shift = int(self.rng.integers(0, 4))
        gain = float(self.rng.uniform(0.9, 1.1))
        signal = torch.roll(self.signals[i], shift) * gain
        return signal, self.labels[i]


def main():
    torch.manual_seed(0)
    loader = DataLoader(NoisySignals(), batch_size=16, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    for signals, labels in loader:
        loss = nn.functional.cross_entropy(model(signals), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
