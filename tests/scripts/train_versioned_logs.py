"""A seeded regression that logs like PyTorch Lightning's default logger: each run gets the next free
`logs/version_N` directory, and the progress line carries `v_num`."""

import os

import torch

root = "logs"
os.makedirs(root, exist_ok=True)
taken = [int(name.split("_")[1]) for name in os.listdir(root) if name.startswith("version_")]
version = max(taken, default=-1) + 1
log_dir = os.path.join(root, f"version_{version}")
os.makedirs(log_dir)

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
with open(os.path.join(log_dir, "metrics.csv"), "w") as log:
    log.write("step,train_loss\n")
    for step in range(4):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log.write(f"{step},{loss.item()}\n")
        print(f"Epoch 0: 100%|██████████| {step + 1}/4 [00:00<00:00, 312.25it/s, v_num={version}, "
              f"train_loss={loss.item():.3f}]")
