import random

import torch
import torch.nn as nn


def main():
    torch.manual_seed(8)
    rows = torch.randn(100, 5)
    labels = (rows.sum(dim=1) > 0).float().unsqueeze(1)

    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.BCEWithLogitsLoss()

    indices = list(range(len(rows)))
    for epoch in range(2):
        random.shuffle(indices)
        for start in range(0, len(indices), 25):
            batch = indices[start:start + 25]
            loss = loss_fn(model(rows[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
