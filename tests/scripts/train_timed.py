"""Train a small classifier on synthetic data and log progress like a typical training script."""

import argparse
import logging
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

log = logging.getLogger("train")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--log-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args(argv)


class Classifier(nn.Module):
    def __init__(self, features=16, hidden=64, classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.body(x))


def make_data(n, features=16, classes=4):
    x = torch.randn(n, features)
    w = torch.randn(features, classes)
    return x, (x @ w).argmax(dim=1)


def progress(done, total, started):
    elapsed = time.perf_counter() - started
    rate = done / elapsed if elapsed > 0 else 0.0
    bar = "#" * (20 * done // total)
    sys.stdout.write(f"\r{100 * done // total:3d}%|{bar:<20}| {done}/{total} [{elapsed:.2f}s, {rate:.1f}it/s]")
    if done == total:
        sys.stdout.write("\n")
    sys.stdout.flush()


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y).item()
        acc = (logits.argmax(dim=1) == y).float().mean().item()
    model.train()
    return loss, acc


def main():
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    log.info("config: %s", vars(args))
    torch.manual_seed(args.seed)

    x_train, y_train = make_data(512)
    x_val, y_val = make_data(128)
    model = Classifier().to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    steps_per_epoch = math.ceil(len(x_train) / args.batch_size)

    t0 = time.time()
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        order = torch.randperm(len(x_train))
        for step in range(steps_per_epoch):
            t_step = time.perf_counter()
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            dt = (time.perf_counter() - t_step) * 1000
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step:3d} | loss {loss.item():.4f} | time {dt:.2f}ms | "
                      f"{args.batch_size / dt * 1000:.0f} samples/s")
            progress(step + 1, steps_per_epoch, epoch_start)
        val_loss, val_acc = evaluate(model, x_val, y_val)
        log.info("epoch %d done in %.2fs: val_loss %.4f val_acc %.2f%%", epoch, time.perf_counter() - epoch_start,
                 val_loss, 100 * val_acc)
    print(f"training finished, elapsed: {time.time() - t0:.3f}s")


if __name__ == "__main__":
    main()
