"""A seeded distillation step whose softmax temperature anneals across sessions: each run appends its
session to a log and reads the schedule back."""

import json

import torch

with open("sessions.jsonl", "a") as log:
    log.write(json.dumps({"event": "start"}) + "\n")
with open("sessions.jsonl") as log:
    sessions = [json.loads(line) for line in log]
temperature = 0.94 - 0.03 * len(sessions)

torch.manual_seed(0)
teacher = torch.nn.Linear(8, 4)
student = torch.nn.Linear(8, 4)
optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
x = torch.randn(16, 8)
for step in range(3):
    target = torch.softmax(teacher(x) / temperature, dim=-1)
    loss = torch.nn.functional.kl_div(torch.log_softmax(student(x) / temperature, dim=-1), target,
                                      reduction="batchmean")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
torch.save({"T": temperature, "weight": student.weight.detach()}, "student.pt")
print(f"T = {temperature:.2f}, loss = {loss.item():.4f}")
