import torch
import torch.nn as nn

CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the bird sang a song",
    "my cat likes the warm sun",
    "a small dog sat by the door",
    "birds fly over the park",
]


class BagOfWords(nn.Module):
    def __init__(self, vocab_size, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.out = nn.Linear(dim, 2)

    def forward(self, ids):
        return self.out(self.embed(ids).mean(dim=1))


def main():
    torch.manual_seed(0)
    words = set(w for line in CORPUS for w in line.split())
    vocab = {w: i for i, w in enumerate(words)}
    width = max(len(line.split()) for line in CORPUS)
    ids = torch.tensor([
        [vocab[w] for w in line.split()] + [vocab["the"]] * (width - len(line.split()))
        for line in CORPUS
    ])
    labels = torch.tensor([0, 1, 0, 0, 1, 1])

    model = BagOfWords(len(vocab))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(5):
        loss = nn.functional.cross_entropy(model(ids), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"vocab {len(vocab)} final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
