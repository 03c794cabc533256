import torch
import torch.nn as nn


def main():
    torch.manual_seed(3)
    x_train = torch.randn(96, 10)
    y_train = torch.randn(96, 1)
    x_val = torch.randn(32, 12)

    model = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for step in range(2):
        loss = nn.functional.mse_loss(model(x_train), y_train)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")

    with torch.no_grad():
        val_pred = model(x_val)
    print(f"validation mean {val_pred.mean().item():.6f}")


if __name__ == "__main__":
    main()
