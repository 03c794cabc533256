import json
import os

import torch
import torch.nn as nn


def score(model, n):
    x = torch.linspace(0, 1, n * 6).reshape(n, 6)
    return model(x).squeeze(1).tolist()


def main():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))
    warmup = [score(model, 4) for _ in range(3)]
    # detach from everything the launcher handed down, as a service does before it writes its files
    os.closerange(3, 4096)
    with open("scores.json", "w") as fh:
        results = [score(model, 8) for _ in range(4)]
        json.dump({"warmup": len(warmup), "scores": results}, fh)
    print("exported", sum(len(r) for r in results), "scores")


if __name__ == "__main__":
    main()
