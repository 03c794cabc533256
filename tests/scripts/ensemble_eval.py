from concurrent.futures import ThreadPoolExecutor, as_completed

import torch
import torch.nn as nn


def expert_scores(weights, x):
    hidden, out = weights
    with torch.no_grad():
        return torch.tanh(x @ hidden) @ out


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x = torch.randn(4096, 64)
    experts = [(torch.randn(64, 128) / 8, torch.randn(128, 4) * (1 + k)) for k in range(8)]

    blended = torch.zeros(4096, 4)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(expert_scores, w, x) for w in experts]
        for future in as_completed(futures):
            blended = blended + future.result()

    head = nn.Linear(4, 2)
    labels = (x[:, 0] > 0).long()
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    for step in range(3):
        loss = nn.functional.cross_entropy(head(blended / len(experts)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
