"""Scores token-bag requests with a small embedding model (inference only)."""

import hashlib

import torch
from torch import nn


class BagScorer(nn.Module):
    def __init__(self, vocab: int = 500, dim: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(ids))
        h = torch.nn.functional.gelu(h) * self.scale
        weights = torch.softmax(h, dim=-1)
        return (weights * h).tanh()


def main() -> None:
    torch.manual_seed(3)
    model = BagScorer().eval()
    digest = hashlib.sha256()
    with torch.no_grad():
        for _ in range(3):
            ids = torch.randint(0, 500, (96, 12))
            scores = model(ids)
            digest.update(scores.numpy().tobytes())
    print("scores", digest.hexdigest()[:16])


if __name__ == "__main__":
    main()
