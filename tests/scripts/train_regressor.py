import numpy as np
import torch
import torch.nn as nn

STEPS = 8
WARMUP = 3


def jitter(batch, scale=0.05):
    noise = np.random.normal(0.0, scale, size=tuple(batch.shape))
    return batch + torch.from_numpy(noise).float()


def main():
    torch.manual_seed(1234)
    x = torch.randn(128, 16)
    y = x[:, :4].sum(dim=1, keepdim=True) - x[:, 4:8].mean(dim=1, keepdim=True)

    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()

    for step in range(STEPS):
        inputs = x
        if step >= WARMUP:
            inputs = jitter(x)
        pred = model(inputs)
        loss = loss_fn(pred, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
