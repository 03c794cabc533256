import torch
import torch.nn as nn


class ItemScorer(nn.Module):
    def __init__(self, num_items, dim=16):
        super().__init__()
        self.item_vectors = nn.Parameter(torch.randn(num_items, dim) * 0.1)
        self.score = nn.Linear(dim, 1)

    def forward(self, item_ids):
        vectors = self.item_vectors[item_ids]
        return self.score(vectors)


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    num_items = 64
    item_ids = torch.randint(0, num_items, (65536,))
    ratings = torch.randn(65536, 1)

    model = ItemScorer(num_items)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for epoch in range(3):
        predicted = model(item_ids)
        loss = (predicted - ratings).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
