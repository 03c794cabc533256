import torch
import torch.nn as nn

COLUMNS = ["age", "tenure", "visits", "spend", "returns", "tickets", "logins", "referrals"]


def load_columns(rows=256):
    gen = torch.Generator().manual_seed(3)
    return {name: torch.randn(rows, generator=gen) for name in COLUMNS}


def main():
    torch.manual_seed(0)
    columns = load_columns()
    selected = {"age", "tenure", "spend", "visits", "tickets", "logins"}
    features = torch.stack([columns[name] for name in selected], dim=1)
    target = columns["returns"].unsqueeze(1)

    model = nn.Sequential(nn.Linear(len(selected), 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(4):
        loss = nn.functional.mse_loss(model(features), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
