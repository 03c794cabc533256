"""Reference workload: a deep, narrow MLP (110 Linear(32, 32) layers, 116K parameters) trained with Adam: many
small tensors per step (220 parameters, their gradients and three Adam state tensors each: 1,100 records at the
optimizer step), where detaudit's fixed cost per record, not hashing bandwidth, sets its overhead."""

import torch
import torch.nn as nn
from _common import parse_args, train_classifier

LAYERS, WIDTH = 110, 32


def main() -> None:
    args = parse_args(__doc__)
    inputs = torch.randn(8, 16, WIDTH)
    labels = torch.randint(0, 10, (8, 16))
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 10)).to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_classifier(model, optimizer, inputs, labels, args)


if __name__ == "__main__":
    main()
