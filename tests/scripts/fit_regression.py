import numpy as np
import torch
import torch.nn as nn


def get_batch(true_w, batch_size=32):
    x = torch.from_numpy(np.random.randn(batch_size, 10).astype(np.float32))
    y = x @ true_w + 0.01
    return x, y


def main():
    torch.manual_seed(0)
    true_w = torch.randn(10, 1)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    for step in range(6):
        x, y = get_batch(true_w)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
