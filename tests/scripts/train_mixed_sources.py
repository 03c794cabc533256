import random

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def seed_worker(worker_id):
    np.random.seed(torch.initial_seed() % 2**32)
    random.seed(torch.initial_seed() % 2**32)


def main():
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    rng = np.random.default_rng(7)

    features = torch.from_numpy(rng.normal(size=(128, 12)).astype(np.float32))
    labels = torch.tensor([random.randrange(3) for _ in range(128)])
    noise = torch.from_numpy(np.random.normal(0, 0.01, size=(128, 12)).astype(np.float32))
    data = TensorDataset(features + noise, labels)
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=2, worker_init_fn=seed_worker,
                        generator=torch.Generator().manual_seed(7))

    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Dropout(0.1), nn.Linear(24, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
