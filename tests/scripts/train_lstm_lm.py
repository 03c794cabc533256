"""A tiny word-level language model: embedding, LSTM, decoder, trained by hand."""

import torch
import torch.nn as nn

VOCAB, WIDTH, SEQ, BATCH = 20, 8, 6, 3


class WordModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, WIDTH)
        self.rnn = nn.LSTM(WIDTH, WIDTH)
        self.decoder = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(output), hidden


def main():
    torch.manual_seed(11)
    corpus = torch.randint(0, VOCAB, (SEQ * 4 + 1, BATCH))
    model = WordModel()
    hidden = (torch.zeros(1, BATCH, WIDTH), torch.zeros(1, BATCH, WIDTH))
    lr = 0.5
    for step, start in enumerate(range(0, SEQ * 3, SEQ)):
        data, targets = corpus[start:start + SEQ], corpus[start + 1:start + 1 + SEQ]
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = nn.functional.cross_entropy(output.view(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        print(f"step {step} loss {loss.item():.6f}")
    with open("model.pt", "wb") as f:
        torch.save(model, f)


if __name__ == "__main__":
    main()
