"""Character-level GPT on a small built-in corpus, compiled with torch.compile."""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

TEXT = (
    "it was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, "
    "it was the season of light, it was the season of darkness, it was the spring of hope. "
) * 4


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, block: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(block, block, dtype=torch.bool), 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def batches(data: torch.Tensor, block: int, size: int, gen: torch.Generator):
    while True:
        starts = torch.randint(0, len(data) - block - 1, (size,), generator=gen)
        x = torch.stack([data[s:s + block] for s in starts])
        y = torch.stack([data[s + 1:s + block + 1] for s in starts])
        yield x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", default="gpt.pt")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    if args.deterministic:
        torch.use_deterministic_algorithms(True)

    torch.manual_seed(1234)
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    model = CharGPT(len(chars), dim=32, layers=2, heads=2, block=16, dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    train_model = model if args.no_compile else torch.compile(model)
    gen = torch.Generator().manual_seed(7)
    stream = batches(data, 16, args.batch_size, gen)

    for step in range(args.steps):
        t0 = time.time()
        x, y = next(stream)
        logits = train_model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}")
        _ = time.time() - t0

    if not args.no_compile:
        from torch._dynamo.utils import counters

        print("compiled graphs:", counters["stats"]["unique_graphs"], "graph breaks:", sum(counters["graph_break"].values()))
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
