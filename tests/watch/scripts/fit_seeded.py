import sys

import torch
import torch.nn as nn


def main():
    torch.manual_seed(1)
    inputs = torch.randn(64, 10)
    targets = torch.randn(64, 1)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(sys.argv[2]) if len(sys.argv) > 2 else 1e-2)
    for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 8):
        order = torch.randperm(64)
        loss = nn.functional.mse_loss(model(inputs[order]), targets[order])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.10f}")
    model.eval()
    with torch.no_grad():
        print(f"final loss {nn.functional.mse_loss(model(inputs), targets).item():.10f}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "fitted.pt")
    print("saved", file=sys.stderr)


if __name__ == "__main__":
    main()
