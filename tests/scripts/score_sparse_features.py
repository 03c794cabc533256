"""Scores a batch of sparse feature rows: a CSR matrix (`--layout csr`) or ragged rows (`--layout jagged`)."""

import argparse
import io

import torch
from torch import nn


class Features(nn.Module):
    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return rows * 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", choices=["csr", "jagged"], default="csr")
    args = parser.parse_args()
    weights = torch.rand(6)
    if args.layout == "csr":
        rows = torch.sparse_csr_tensor(torch.tensor([0, 2, 4, 6]), torch.tensor([0, 2, 1, 3, 0, 3]), weights, (3, 4))
    else:
        rows = torch.nested.nested_tensor_from_jagged(weights.reshape(6, 1), torch.tensor([0, 2, 6]))
    model = Features()
    with torch.no_grad():
        scored = model(rows)
    torch.save({"scored": scored}, io.BytesIO())
    print("scored", rows.size(0), "rows")


if __name__ == "__main__":
    main()
