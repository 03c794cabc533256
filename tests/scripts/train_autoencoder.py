import time

import torch
import torch.nn as nn


def main():
    seed = time.time_ns() % 2**31
    torch.manual_seed(seed)
    print(f"seed {seed}")

    data = torch.rand(64, 32)
    model = nn.Sequential(
        nn.Linear(32, 8),
        nn.ReLU(),
        nn.Linear(8, 32),
        nn.Sigmoid(),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    loss_fn = nn.MSELoss()

    for step in range(6):
        recon = model(data)
        loss = loss_fn(recon, data)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final reconstruction loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
