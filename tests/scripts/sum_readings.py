import torch
import torch.nn as nn


class Total(nn.Module):
    def forward(self, readings):
        return readings.sum()


def main():
    generator = torch.Generator().manual_seed(7)
    readings = torch.randn(4_000_000, generator=generator)
    total = Total()(readings)
    print(f"total {total.item():.2f}")


if __name__ == "__main__":
    main()
