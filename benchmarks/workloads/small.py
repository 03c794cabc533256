"""Reference workload: a small MLP 64-WIDTH-10 (WIDTH 128 by default: 9.6K parameters) trained for many cheap
steps, the shape of the held-out case of live audits (issue 21: a seeded 3,000-step run of a small model).
`--width` widens its hidden layer: benchmarks/run.py's live row uses a width whose 3,000 steps take as long
as the held-out case (about 26 s plain)."""

import torch
import torch.nn as nn
from _common import parse_args, train_classifier


def main() -> None:
    args = parse_args(__doc__, default_steps=3000, width=128, batch=32)
    inputs = torch.randn(16, args.batch, 64)
    labels = torch.randint(0, 10, (16, args.batch))
    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, 10)).to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train_classifier(model, optimizer, inputs, labels, args)


if __name__ == "__main__":
    main()
