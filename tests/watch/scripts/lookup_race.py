import torch
import torch.nn as nn


class BagOfWords(nn.Module):
    def __init__(self, words=8, dim=4):
        super().__init__()
        self.proj = nn.Linear(dim, 1)
        self.words = words

    def forward(self, word_ids, features):
        bags = torch.zeros(self.words, features.shape[1])
        bags.index_put_((word_ids,), features, accumulate=True)
        return self.proj(bags)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    word_ids = torch.randint(0, 8, (200000,))
    features = torch.randn(200000, 4)
    targets = torch.randn(8, 1)
    model = BagOfWords()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    for step in range(6):
        loss = nn.functional.mse_loss(model(word_ids, features), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        torch.save(model.state_dict(), f"bags-{step}.pt")
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
