import random

import torch
import torch.nn as nn


class ProductRanker(nn.Module):
    def __init__(self, num_products, dim=16):
        super().__init__()
        self.product_vectors = nn.Parameter(torch.randn(num_products, dim) * 0.1)
        self.head = nn.Linear(dim, 1)

    def forward(self, product_ids):
        return self.head(self.product_vectors[product_ids])


def main():
    random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    num_products = 64
    catalogue = list(range(num_products))
    random.shuffle(catalogue)
    order = torch.tensor(catalogue)
    product_ids = order[torch.randint(0, num_products, (65536,))]
    clicks = torch.randn(65536, 1)

    model = ProductRanker(num_products)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for epoch in range(3):
        loss = (model(product_ids) - clicks).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
