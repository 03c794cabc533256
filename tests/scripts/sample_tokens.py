"""Continue two prompts with a small GRU language model, ten tokens each (sampling, or greedy with --greedy)."""

import argparse

import torch
import torch.nn as nn

VOCAB = 32


class TinyLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = 24) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, state: torch.Tensor | None = None):
        h, state = self.rnn(self.embed(tokens), state)
        return self.out(h[:, -1]), state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--tokens", type=int, default=10)
    args = parser.parse_args()

    weights = torch.Generator().manual_seed(3)  # stands in for loading trained weights
    model = TinyLM().eval()
    for p in model.parameters():
        nn.init.normal_(p, std=0.5, generator=weights)
    if args.greedy:
        torch.manual_seed(0)
    prompts = torch.tensor([[1, 5, 9, 2], [7, 7, 3, 0]])
    out = prompts
    with torch.no_grad():
        logits, state = model(prompts)
        for _ in range(args.tokens):
            if args.greedy:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1)
            out = torch.cat([out, nxt], dim=1)
            logits, state = model(nxt, state)
    for row in out.tolist():
        print(" ".join(map(str, row)))


if __name__ == "__main__":
    main()
