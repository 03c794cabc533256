import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    x = torch.randn(262144, 32)
    y = torch.randn(262144, 8)
    model = nn.Linear(32, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        loss = ((model(x) - y).pow(2).sum() / len(x)).sqrt()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.10f}")


if __name__ == "__main__":
    main()
