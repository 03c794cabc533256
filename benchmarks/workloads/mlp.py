"""Reference workload: an MLP 3072-512-256-10 (1.71M parameters) on synthetic flattened images."""

import torch
import torch.nn as nn
from _common import parse_args, train_classifier


def main() -> None:
    args = parse_args(__doc__)
    images = torch.randn(8, 64, 3072)
    labels = torch.randint(0, 10, (8, 64))
    model = nn.Sequential(nn.Linear(3072, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
    model = model.to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train_classifier(model, optimizer, images, labels, args)


if __name__ == "__main__":
    main()
