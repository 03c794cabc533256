import torch
import torch.nn as nn


def make_data(n=256):
    x = torch.randn(n, 20)
    w = torch.randn(20, 1)
    y = (x @ w + 0.1 * torch.randn(n, 1) > 0).long().squeeze(1)
    return x, y


def main():
    torch.manual_seed(0)
    x, y = make_data()
    model = nn.Sequential(
        nn.Linear(20, 64),
        nn.ReLU(),
        nn.Linear(64, 32),
        nn.ReLU(),
        nn.Linear(32, 2),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()

    for step in range(5):
        idx = torch.randperm(len(x))[:64]
        logits = model(x[idx])
        loss = loss_fn(logits, y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")

    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    print(f"final loss {loss.item():.8f} acc {acc:.4f}")


if __name__ == "__main__":
    main()
