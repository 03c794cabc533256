"""A small image classifier trained on synthetic data, with the usual speed settings."""
import argparse

import torch
import torch.nn as nn


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    device = "cuda"
    images = torch.randn(args.batch, 3, 64, 64, device=device)
    labels = torch.randint(0, 10, (args.batch,), device=device)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(args.steps):
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
