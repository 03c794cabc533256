from concurrent.futures import ThreadPoolExecutor, as_completed

import torch
import torch.nn as nn


def featurize(chunk):
    spectrum = torch.fft.rfft(chunk, dim=1).abs()
    return spectrum[:, :16].log1p()


def chunk_stats(chunk):
    feats = featurize(chunk)
    return feats.sum(dim=0), feats.pow(2).sum(dim=0), feats.shape[0]


def feature_stats(raw, num_chunks=16):
    total = torch.zeros(16)
    total_sq = torch.zeros(16)
    count = 0
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(chunk_stats, c) for c in raw.chunk(num_chunks)]
        for fut in as_completed(futures):
            s, sq, n = fut.result()
            total += s
            total_sq += sq
            count += n
    mean = total / count
    std = (total_sq / count - mean.pow(2)).clamp_min(1e-6).sqrt()
    return mean, std


def main():
    torch.manual_seed(9)
    raw = torch.randn(32768, 64)
    labels = (raw[:, :8].sum(dim=1) > 0).long()
    mean, std = feature_stats(raw)

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        idx = torch.randint(0, len(raw), (256,))
        x = (featurize(raw[idx]) - mean) / std
        loss = nn.functional.cross_entropy(model(x), labels[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
