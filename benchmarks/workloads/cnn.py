"""Reference workload: a small CNN (conv16-pool-conv32-pool-fc) on synthetic 32x32 RGB images."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import parse_args, train_classifier


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc(x.flatten(1))


def main() -> None:
    args = parse_args(__doc__)
    images = torch.randn(8, 64, 3, 32, 32)
    labels = torch.randint(0, 10, (8, 64))
    model = SmallCNN().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train_classifier(model, optimizer, images, labels, args)


if __name__ == "__main__":
    main()
