import torch
import torch.nn as nn


def main():
    torch.manual_seed(3)
    rows = torch.randn(64, 6)
    targets = rows @ torch.randn(6, 1)

    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    noise_gen = torch.Generator()
    noise_gen.seed()

    for step in range(3):
        batch = slice(step * 16, step * 16 + 16)
        loss = nn.functional.mse_loss(model(rows[batch]), targets[batch])
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.grad += 0.01 * torch.randn(p.grad.shape, generator=noise_gen)
        optimizer.step()

    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
