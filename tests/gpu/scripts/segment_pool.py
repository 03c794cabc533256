"""Pool node features into per-graph sums and fit a small readout: a GNN-style training loop."""
import argparse

import torch
import torch.nn as nn


class Pooler(nn.Module):
    def __init__(self, dim, use_scatter):
        super().__init__()
        self.embed = nn.Linear(16, dim)
        self.readout = nn.Linear(dim, 1)
        self.use_scatter = use_scatter

    def forward(self, nodes, graph_of_node, num_graphs):
        h = torch.relu(self.embed(nodes))
        pooled = torch.zeros(num_graphs, h.shape[1], device=h.device)
        if self.use_scatter:
            pooled.scatter_add_(0, graph_of_node.unsqueeze(1).expand_as(h), h)
        else:
            pooled.index_add_(0, graph_of_node, h)
        return self.readout(pooled)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scatter", action="store_true", help="pool with scatter_add_ instead of index_add_")
    parser.add_argument("--reproducible", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.reproducible:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    device = "cuda"
    num_graphs = 64
    nodes = torch.randn(1 << 18, 16, device=device)
    graph_of_node = torch.randint(0, num_graphs, (nodes.shape[0],), device=device)
    targets = torch.randn(num_graphs, 1, device=device)
    model = Pooler(64, args.scatter).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        loss = nn.functional.mse_loss(model(nodes, graph_of_node, num_graphs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
