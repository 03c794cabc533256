import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class NoisySignals(Dataset):
    def __init__(self, n=64, width=24):
        base = torch.linspace(0, 6.28, width)
        self.signals = torch.stack([torch.sin(base * (1 + i % 5)) for i in range(n)])
        self.labels = torch.arange(n) % 3
        self.rng = None

    def __len__(self):
        return len(self.signals)

    def __getitem__(self, i):
        if self.rng is None:
            self.rng = np.random.default_rng()
        noise = torch.from_numpy(self.rng.normal(0.0, 0.1, self.signals.shape[1]).astype(np.float32))
        return self.signals[i] + noise, self.labels[i]


def main():
    torch.manual_seed(0)
    loader = DataLoader(NoisySignals(), batch_size=16, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(0))
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
