import torch
import torch.nn as nn


class TinyLM(nn.Module):
    def __init__(self, vocab=12, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.embed(ids))))


def main():
    torch.manual_seed(0)
    model = TinyLM()
    params = list(set(model.parameters()))
    optimizer = torch.optim.Adam(params, lr=0.01)
    ids = torch.randint(0, 12, (16,))
    for step in range(2):
        loss = nn.functional.cross_entropy(model(ids), ids)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
