"""A small policy-gradient loop on a toy bandit, logging as RL training scripts do."""

import argparse
import time

import numpy as np
import torch
import torch.nn as nn


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-episodes", type=int, default=0)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    rewards = torch.linspace(-1.0, 1.0, 4)
    policy = nn.Linear(4, 4)
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.05)
    observation = torch.eye(4)
    global_step = 0
    start_time = time.time()
    for update in range(1, args.updates + 1):
        dist = torch.distributions.Categorical(logits=policy(observation))
        actions = dist.sample()
        returns = rewards[actions]
        loss = -(dist.log_prob(actions) * returns).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        global_step += len(actions)
        print(f"global_step={global_step}, episodic_return={returns.sum().item():.2f}")
        if update % 2 == 0:
            print("SPS:", int(global_step / (time.time() - start_time)))
    if args.eval_episodes:
        probs = torch.softmax(policy(observation), dim=1).detach().numpy()
        picks = [np.random.default_rng().choice(4, p=p / p.sum()) for p in probs for _ in range(args.eval_episodes)]
        print("eval returns", " ".join(f"{r:.2f}" for r in rewards.numpy()[picks]))


if __name__ == "__main__":
    main()
