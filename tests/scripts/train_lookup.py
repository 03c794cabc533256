import torch
import torch.nn as nn


class LookupRegressor(nn.Module):
    def __init__(self, num_items=64, dim=16):
        super().__init__()
        self.table = nn.Parameter(torch.randn(num_items, dim) * 0.1)
        self.head = nn.Linear(dim, 1)

    def forward(self, item_ids):
        return self.head(self.table[item_ids])


def main():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    item_ids = torch.randint(0, 64, (65536,))
    scores = torch.randn(65536, 1)

    model = LookupRegressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(5):
        pred = model(item_ids)
        loss = (pred - scores).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
