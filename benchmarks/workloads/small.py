"""Reference workload: a small MLP 64-128-10 (9.6K parameters) trained for many cheap steps, the shape of
the held-out case of live audits (issue 21: a seeded 3,000-step run of a small model)."""

import torch
import torch.nn as nn
from _common import parse_args, train_classifier


def main() -> None:
    args = parse_args(__doc__, default_steps=3000)
    inputs = torch.randn(16, 32, 64)
    labels = torch.randint(0, 10, (16, 32))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train_classifier(model, optimizer, inputs, labels, args)


if __name__ == "__main__":
    main()
