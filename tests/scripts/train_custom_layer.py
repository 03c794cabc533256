import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        rms = x.pow(2).mean(dim=-1, keepdim=True).add(self.eps).rsqrt()
        return x * rms * self.weight


def main():
    torch.manual_seed(4)
    samples = [(torch.randn(10), torch.randn(1)) for _ in range(64)]
    x = torch.stack([s[0] for s in samples])
    y = torch.stack([s[1] for s in samples])
    del samples

    model = nn.Sequential(
        nn.Linear(10, 32),
        RMSNorm(32),
        nn.ReLU(),
        nn.Linear(32, 1),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
