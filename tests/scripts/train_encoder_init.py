import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.proj(x))))


def build():
    with torch.random.fork_rng():
        torch.manual_seed(11)
        return Encoder()


def main():
    model = build()
    inputs = torch.linspace(-1, 1, 32 * 8).reshape(32, 8)
    targets = inputs.sum(dim=1, keepdim=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
