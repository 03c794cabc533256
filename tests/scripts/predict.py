import torch
import torch.nn as nn


def build_model():
    return nn.Sequential(
        nn.Linear(12, 48),
        nn.ReLU(),
        nn.Dropout(p=0.2),
        nn.Linear(48, 3),
    )


def load_weights(model, seed=7):
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        state[name] = torch.empty_like(tensor)
        if name.endswith("weight"):
            nn.init.kaiming_uniform_(state[name], a=5 ** 0.5, generator=gen)
        else:
            nn.init.uniform_(state[name], -0.1, 0.1, generator=gen)
    model.load_state_dict(state)


def main():
    model = build_model()
    load_weights(model)

    inputs = torch.linspace(-2.0, 2.0, 8 * 12).reshape(8, 12)
    with torch.no_grad():
        scores = model(inputs)
    probs = scores.softmax(dim=1)
    print("predictions", probs.argmax(dim=1).tolist())
    print(f"mean confidence {probs.max(dim=1).values.mean().item():.8f}")


if __name__ == "__main__":
    main()
