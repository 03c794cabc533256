import numpy as np
import torch
import torch.nn as nn


def main():
    torch.manual_seed(42)
    features = torch.randn(120, 6)
    targets = (features[:, 0] - features[:, 1] > 0).long()

    model = nn.Sequential(nn.Linear(6, 20), nn.ReLU(), nn.Linear(20, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    rng = np.random.default_rng()
    batch_size = 40

    for epoch in range(2):
        order = rng.permutation(len(features))
        for start in range(0, len(order), batch_size):
            idx = torch.from_numpy(order[start:start + batch_size])
            loss = nn.functional.cross_entropy(model(features[idx]), targets[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.6f}")

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
