"""A seeded product ranker: the title's token ids averaged by an EmbeddingBag, a thumbnail through a small
convolution, one score per product."""

import torch

torch.manual_seed(0)


class Ranker(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.title = torch.nn.EmbeddingBag(100, 8, mode="mean")
        self.thumb = torch.nn.Conv2d(3, 4, kernel_size=3)
        self.score = torch.nn.Linear(8 + 4, 1)

    def forward(self, tokens: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        pooled = self.thumb(image).mean(dim=(2, 3))
        return self.score(torch.cat([self.title(tokens), pooled], dim=1))


model = Ranker()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
tokens = torch.randint(0, 100, (16, 5))
images = torch.rand(16, 3, 8, 8)
clicks = torch.rand(16, 1)
for step in range(3):
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(tokens, images), clicks)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"final loss {loss.item():.6f}")
