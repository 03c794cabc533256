"""Sample text from a small character-level language model (temperature sampling, one token at a time)."""

import argparse

import numpy as np
import torch
import torch.nn as nn

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,"


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, state: torch.Tensor | None = None):
        h, state = self.rnn(self.embed(tokens), state)
        return self.out(h[:, -1]), state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt", default="the quick brown fox")
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(1234)  # stands in for loading trained weights
    np.random.seed(args.seed)
    model = TinyLM(len(ALPHABET)).eval()
    tokens = torch.tensor([[ALPHABET.index(c) for c in args.prompt]])
    text = args.prompt
    with torch.inference_mode():
        logits, state = model(tokens)
        for _ in range(args.length):
            probs = torch.softmax(logits[0] / args.temperature, dim=-1).double().numpy()
            nxt = int(np.random.choice(len(ALPHABET), p=probs / probs.sum()))
            text += ALPHABET[nxt]
            logits, state = model(torch.tensor([[nxt]]), state)
    print(text)


if __name__ == "__main__":
    main()
