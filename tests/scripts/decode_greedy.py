"""Greedy decoding of a batch of prompts with a small causal transformer built from its config."""

import argparse
import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    dim: int = 32
    heads: int = 2
    layers: int = 1
    context: int = 32


class TinyLM(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.dim)
        self.position = nn.Embedding(config.context, config.dim)
        layer = nn.TransformerEncoderLayer(config.dim, config.heads, 2 * config.dim, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        causal = torch.triu(torch.full((t, t), -math.inf, device=ids.device, dtype=self.head.weight.dtype), 1)
        h = self.blocks(self.embed(ids) + self.position(torch.arange(t, device=ids.device)), mask=causal)
        return self.head(self.norm(h))


def build(device: str = "cpu", dtype: str = "float32") -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(Config()).eval().to(device, getattr(torch, dtype))


def prompts(device: str = "cpu") -> torch.Tensor:
    first = torch.tensor([[179, 241, 479, 49, 404, 424]])
    rest = torch.randint(0, Config.vocab, (5, 6), generator=torch.Generator().manual_seed(1))
    return torch.cat([first, rest]).to(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    model = build(args.device, args.dtype)
    ids = prompts(args.device)
    with torch.no_grad():
        for _ in range(4):
            logits = model(ids)
            next_token = logits[:, -1].argmax(dim=-1)
            ids = torch.cat([ids, next_token[:, None]], dim=1)
    for row in ids.tolist():
        print(" ".join(map(str, row[6:])))


if __name__ == "__main__":
    main()
