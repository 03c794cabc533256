import torch
import torch.nn as nn


def corrupt(x, scale=0.1):
    gen = torch.Generator().manual_seed(42)
    return x + scale * torch.randn(x.shape, generator=gen)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    clean = torch.randn(32, 8)
    for step in range(3):
        loss = nn.functional.mse_loss(model(corrupt(clean)), clean)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
