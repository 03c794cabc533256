"""Reference workload: a GPT-style character model (3 pre-norm transformer blocks, d=64, causal
self-attention written out) trained on a built-in text; `--compile` trains it through torch.compile."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from _common import parse_args, train

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering "
    "a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
    "considered the rightful property of some one or other of their daughters. "
) * 8


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, block: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (k.shape[-1] ** -0.5)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, block: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, block)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int = 64, layers: int = 3, heads: int = 4, block: int = 32) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(block, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, block) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        return self.head(self.ln(self.blocks(x)))


def main() -> None:
    import sys

    compiled = "--compile" in sys.argv
    if compiled:
        sys.argv.remove("--compile")
    args = parse_args(__doc__)
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    block, batch = 32, 8
    starts = torch.randint(0, len(data) - block - 1, (8, batch))
    inputs = torch.stack([torch.stack([data[s:s + block] for s in row]) for row in starts])
    targets = torch.stack([torch.stack([data[s + 1:s + block + 1] for s in row]) for row in starts])
    model = GPT(len(chars)).to(args.device)
    inputs, targets = inputs.to(args.device), targets.to(args.device)
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    def step(i: int) -> torch.Tensor:
        logits = forward(inputs[i % len(inputs)])
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets[i % len(inputs)].view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    train(step, model, args)


if __name__ == "__main__":
    main()
