import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Jittered(Dataset):
    def __init__(self, n=64, width=24):
        self.x = torch.linspace(-1, 1, n * width).reshape(n, width)
        self.y = torch.arange(n) % 3

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = np.random.normal(0.0, 0.05, self.x.shape[1]).astype(np.float32)
        return self.x[i] + torch.from_numpy(noise) + 0.01 * torch.randn(self.x.shape[1]), self.y[i]


def main():
    torch.manual_seed(0)
    loader = DataLoader(Jittered(), batch_size=16, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
