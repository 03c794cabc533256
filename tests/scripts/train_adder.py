import math

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler


class AdditionDataset(Dataset):
    def __init__(self, ndigit=2):
        self.ndigit = ndigit
        rng = torch.Generator()
        rng.manual_seed(1337)
        self.ixes = torch.randperm((10 ** ndigit) ** 2, generator=rng)

    def get_vocab_size(self):
        return 10

    def get_block_size(self):
        return 3 * self.ndigit + 1 - 1

    def __len__(self):
        return self.ixes.nelement()

    def __getitem__(self, idx):
        nd = 10 ** self.ndigit
        idx = self.ixes[idx].item()
        a, b = idx // nd, idx % nd
        astr, bstr = f"%0{self.ndigit}d" % a, f"%0{self.ndigit}d" % b
        cstr = (f"%0{self.ndigit + 1}d" % (a + b))[::-1]
        dix = [int(s) for s in astr + bstr + cstr]
        x = torch.tensor(dix[:-1], dtype=torch.long)
        y = torch.tensor(dix[1:], dtype=torch.long)
        y[: self.ndigit * 2 - 1] = -1
        return x, y


class TinyGPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_embd=32):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.ln_f = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)
        torch.nn.init.normal_(self.mlp[2].weight, mean=0.0, std=0.02 / math.sqrt(2))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long).unsqueeze(0)
        h = self.wte(idx) + self.wpe(pos)
        h = h + self.mlp(h)
        logits = self.lm_head(self.ln_f(h))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def train(model, dataset, max_iters=4, batch_size=16):
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    train_loader = DataLoader(
        dataset,
        sampler=RandomSampler(dataset, replacement=True, num_samples=int(1e10)),
        shuffle=False,
        batch_size=batch_size,
        num_workers=0,
    )
    model.train()
    data_iter = iter(train_loader)
    for iter_num in range(max_iters):
        batch = next(data_iter)
        x, y = batch
        logits, loss = model(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        print(f"iter {iter_num}: train loss {loss.item():.5f}")


if __name__ == "__main__":
    dataset = AdditionDataset()
    model = TinyGPT(dataset.get_vocab_size(), dataset.get_block_size())
    train(model, dataset)
