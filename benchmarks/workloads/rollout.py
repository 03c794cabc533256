"""Reference workload: a PPO-like rollout job (cleanrl ppo.py's shape). Every 16th optimizer step first collects a
rollout: 64 no-grad policy forwards over 8 synthetic environments (a seeded torch simulation), with advantages by
GAE; each step is then one Adam update of the clipped objective on a minibatch (4 epochs of 4 minibatches)."""

import torch
import torch.nn as nn
from _common import parse_args, train

OBS, ACTIONS, ENVS, HORIZON, EPOCHS, MINIBATCHES = 8, 4, 8, 64, 4, 4
GAMMA, LAMBDA, CLIP = 0.99, 0.95, 0.2


def mlp(out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(OBS, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out))


class Agent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.actor, self.critic = mlp(ACTIONS), mlp(1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(obs), self.critic(obs).squeeze(-1)


class Env:
    """ENVS copies of a small nonlinear system: the action pushes the state, the reward keeps it near zero."""

    def __init__(self, device: str) -> None:
        self.mix = torch.randn(OBS, OBS, device=device) * 0.5
        self.push = torch.randn(ACTIONS, OBS, device=device) * 0.3
        self.state = torch.randn(ENVS, OBS, device=device)

    def step(self, action: torch.Tensor) -> torch.Tensor:
        self.state = torch.tanh(self.state @ self.mix + self.push[action]) + 0.01 * torch.randn_like(self.state)
        return -(self.state ** 2).sum(-1)


def main() -> None:
    args = parse_args(__doc__)
    agent = Agent().to(args.device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    env = Env(args.device)
    size = ENVS * HORIZON // MINIBATCHES
    batch: dict[str, torch.Tensor] = {}

    def rollout() -> None:
        obs = torch.zeros(HORIZON, ENVS, OBS, device=args.device)
        actions = torch.zeros(HORIZON, ENVS, dtype=torch.long, device=args.device)
        logprobs, rewards, values = (torch.zeros(HORIZON, ENVS, device=args.device) for _ in range(3))
        with torch.no_grad():
            for t in range(HORIZON):
                obs[t] = env.state
                logits, values[t] = agent(env.state)
                dist = torch.distributions.Categorical(logits=logits)
                actions[t] = dist.sample()
                logprobs[t] = dist.log_prob(actions[t])
                rewards[t] = env.step(actions[t])
            advantages = torch.zeros_like(rewards)
            last = torch.zeros(ENVS, device=args.device)
            next_value = agent(env.state)[1]
            for t in reversed(range(HORIZON)):
                following = next_value if t == HORIZON - 1 else values[t + 1]
                delta = rewards[t] + GAMMA * following - values[t]
                advantages[t] = last = delta + GAMMA * LAMBDA * last
        batch.update(obs=obs.reshape(-1, OBS), actions=actions.reshape(-1), logprobs=logprobs.reshape(-1),
                     advantages=advantages.reshape(-1), returns=(advantages + values).reshape(-1))

    def step(i: int) -> torch.Tensor:
        if i % (EPOCHS * MINIBATCHES) == 0:
            rollout()
        if i % MINIBATCHES == 0:
            batch["order"] = torch.randperm(ENVS * HORIZON, device=args.device)
        idx = batch["order"][(i % MINIBATCHES) * size:(i % MINIBATCHES + 1) * size]
        logits, value = agent(batch["obs"][idx])
        dist = torch.distributions.Categorical(logits=logits)
        ratio = (dist.log_prob(batch["actions"][idx]) - batch["logprobs"][idx]).exp()
        adv = batch["advantages"][idx]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
        value_loss = 0.5 * ((value - batch["returns"][idx]) ** 2).mean()
        loss = policy_loss - 0.01 * dist.entropy().mean() + 0.5 * value_loss
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
        optimizer.step()
        return loss

    train(step, agent, args)


if __name__ == "__main__":
    main()
