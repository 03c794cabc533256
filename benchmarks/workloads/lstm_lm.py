"""Reference workload: a word-level LSTM language model trained by hand (pytorch/examples word_language_model's
shape: Embedding, a 2-layer LSTM of 64 through oneDNN on the CPU, Linear decoder; truncated BPTT of 35 tokens
over 20 sequences; gradient clipping, then `p.data.add_(p.grad, alpha=-lr)`): no optimizer."""

import torch
import torch.nn as nn
from _common import parse_args, train

VOCAB, WIDTH, LAYERS, BPTT, BATCH = 1000, 64, 2, 35, 20


class WordModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, WIDTH)
        self.rnn = nn.LSTM(WIDTH, WIDTH, LAYERS)
        self.decoder = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        output, hidden = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(output), hidden


def main() -> None:
    args = parse_args(__doc__)
    corpus = torch.randint(0, VOCAB, (BPTT * 50 + 1, BATCH), device=args.device)
    model = WordModel().to(args.device)
    zeros = torch.zeros(LAYERS, BATCH, WIDTH, device=args.device)
    state = {"hidden": (zeros, zeros)}
    lr = 20.0

    def step(i: int) -> torch.Tensor:
        start = (i * BPTT) % (len(corpus) - 1 - BPTT)
        data, targets = corpus[start:start + BPTT], corpus[start + 1:start + 1 + BPTT]
        hidden = tuple(h.detach() for h in state["hidden"])
        model.zero_grad()
        output, state["hidden"] = model(data, hidden)
        loss = nn.functional.cross_entropy(output.view(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        return loss

    train(step, model, args)


if __name__ == "__main__":
    main()
