import torch
import torch.nn as nn
import torch.nn.functional as F


class LossTerm:
    def __init__(self, fn, weight):
        self.fn = fn
        self.weight = weight

    def __call__(self, pred, target):
        return self.weight * self.fn(pred, target)


def main():
    torch.manual_seed(21)
    x = torch.randn(64, 12)
    y = torch.randn(64, 3)

    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    terms = set()
    terms.add(LossTerm(F.mse_loss, 1.0))
    terms.add(LossTerm(F.l1_loss, 0.5))
    terms.add(LossTerm(F.smooth_l1_loss, 0.3))
    terms.add(LossTerm(lambda p, t: F.huber_loss(p, t, delta=0.5), 0.2))
    terms.add(LossTerm(lambda p, t: (p - t).pow(4).mean(), 0.05))

    for step in range(5):
        pred = model(x)
        loss = sum(term(pred, y) for term in terms)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
