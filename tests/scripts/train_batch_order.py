import random

import torch
import torch.nn as nn


def batches(n, size, rng):
    order = list(range(n))
    rng.shuffle(order)
    return [order[i:i + size] for i in range(0, n, size)]


def main():
    torch.manual_seed(5)
    random.seed(5)
    rows = torch.randn(80, 4)
    labels = (rows[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = random.Random()

    for epoch in range(2):
        for batch in batches(len(rows), 20, sampler):
            loss = nn.functional.cross_entropy(model(rows[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
