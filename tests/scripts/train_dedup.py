import torch
import torch.nn as nn


class Sample:
    def __init__(self, features, label):
        self.features = features
        self.label = label


def load_samples(n=600):
    samples = [Sample(torch.randn(8), float(i % 2)) for i in range(n)]
    return samples + samples[: n // 6]  # the export overlaps with the previous one


def main():
    torch.manual_seed(0)
    unique = set(load_samples())
    x = torch.stack([s.features for s in unique])
    y = torch.tensor([[s.label] for s in unique])

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for start in range(0, 256, 64):
        loss = nn.functional.binary_cross_entropy_with_logits(model(x[start:start + 64]), y[start:start + 64])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"samples {len(unique)} final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
