import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class NoisySignals(Dataset):
    def __init__(self, n=96, length=32):
        t = torch.linspace(0, 1, length)
        self.signals = torch.stack([torch.sin(2 * np.pi * (1 + i % 4) * t) for i in range(n)])
        self.labels = torch.tensor([i % 4 for i in range(n)])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        noise = np.random.normal(0.0, 0.05, size=self.signals.shape[1]).astype(np.float32)
        shift = int(torch.randint(0, 4, ()))
        signal = torch.roll(self.signals[i], shift) + torch.from_numpy(noise)
        return signal, self.labels[i]


def seed_worker(worker_id):
    np.random.seed(torch.initial_seed() % 2**32)


def main():
    torch.manual_seed(0)
    loader = DataLoader(
        NoisySignals(),
        batch_size=16,
        shuffle=True,
        num_workers=2,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(0),
    )
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
