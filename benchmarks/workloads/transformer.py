"""Reference workload: a 2-layer transformer encoder (d=128, 4 heads) classifying synthetic token sequences."""

import torch
import torch.nn as nn
from _common import parse_args, train_classifier


class Encoder(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=256, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def main() -> None:
    args = parse_args(__doc__)
    tokens = torch.randint(0, 1000, (8, 32, 32))
    labels = torch.randint(0, 10, (8, 32))
    model = Encoder().to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_classifier(model, optimizer, tokens, labels, args)


if __name__ == "__main__":
    main()
