import torch
import torch.nn as nn


class GraphRegressor(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.readout = nn.Linear(dim, 1)

    def forward(self, nodes, graph_of_node, num_graphs):
        h = torch.relu(self.embed(nodes))
        pooled = torch.zeros(num_graphs, h.shape[1], device=h.device)
        pooled.index_add_(0, graph_of_node, h)
        counts = torch.bincount(graph_of_node, minlength=num_graphs).clamp(min=1).unsqueeze(1)
        return self.readout(pooled / counts)


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    num_graphs = 32
    nodes = torch.randn(600, 8, device=device)
    graph_of_node = torch.randint(0, num_graphs, (600,), device=device)
    targets = torch.randn(num_graphs, 1, device=device)
    model = GraphRegressor().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        loss = nn.functional.mse_loss(model(nodes, graph_of_node, num_graphs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.8f}")


if __name__ == "__main__":
    main()
