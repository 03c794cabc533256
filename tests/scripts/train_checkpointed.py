import tempfile
from pathlib import Path

import torch
import torch.nn as nn


def main():
    torch.manual_seed(31)
    x = torch.randn(64, 12)
    y = torch.randn(64, 2)

    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    with tempfile.TemporaryDirectory() as tmp:
        ckpt_dir = Path(tmp)
        for step in range(6):
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if (step + 1) % 2 == 0:
                torch.save(model.state_dict(), ckpt_dir / f"model_{step + 1}.pt")
        torch.save(optimizer.state_dict(), ckpt_dir / "optimizer.pt")
        saved = sorted(p.name for p in ckpt_dir.iterdir())

    print(f"saved {saved}")
    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
