import torch
import torch.nn as nn

try:
    import detaudit
except ImportError:
    detaudit = None


def main():
    torch.manual_seed(17)
    x = torch.randn(128, 8)
    y = (x[:, 0] > x[:, 1]).long()

    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(5):
        logits = model(x)
        if detaudit:
            detaudit.checkpoint("logits", logits)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if detaudit:
            detaudit.checkpoint("loss", loss)

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
