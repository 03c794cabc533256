"""The running torch's list of nondeterministic ops, parsed from `torch.use_deterministic_algorithms.__doc__`.

The docstring is the source because it changes between releases; the parse is pure text so it is
testable without torch. Each bullet becomes an `OpEntry`: the API it names, the device(s) it is
nondeterministic on, and the condition words (backward only, accumulate=..., reduce=...). Measured
CPU facts the docstring files under "acts deterministically" (torch-probe.md §7: index_put_ with
accumulate=True and the backward of advanced indexing give run-to-run bits with 2+ threads) are
covered because the docstring lists them with their CPU condition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BULLET = re.compile(r"^\s*\*\s+:(?:func|class|meth):`([^`]+)`(.*)$")
_QUOTED = re.compile(r"(\w+)='?([\w.]+)'?")
_TORCH_PREFIXES = ("torch.nn.functional.", "torch.nn.", "torch.Tensor.", "torch.")

# autograd Node names whose op has another name in the docstring (node name -> docstring key)
_NODE_ALIASES = {
    "convolution": ("conv1d", "conv2d", "conv3d", "convtranspose1d", "convtranspose2d", "convtranspose3d"),
    "index": ("getitem",),
    "gridsampler2d": ("gridsample",),
    "gridsampler3d": ("gridsample",),
    # torch's `torch.nn.NLLLoss when called on a CUDA tensor` is its image form, nll_loss2d (ATen alerts in
    # nll_loss2d_forward_out_cuda_template only); the plain nll_loss of cross-entropy over (N, C) logits has
    # deterministic CUDA kernels (one block, a fixed-order reduction; no atomics), so its node stands for no entry
    "nllloss": (),
    "nllloss2d": ("nllloss",),
}


@dataclass(frozen=True)
class OpEntry:
    """One bullet of the docstring list."""

    api: str                 # as written: torch.Tensor.index_put, torch.nn.Conv2d
    text: str                # the whole bullet, for evidence lines
    devices: frozenset[str]  # {"cuda"}, {"cpu"}, {"cpu", "cuda"}, or empty = any device
    backward: bool           # only when differentiating (requires grad)
    conditions: tuple[tuple[str, str], ...]  # (argument, value) pairs such as ("accumulate", "True")
    raises: bool             # in the "will throw RuntimeError" list (no deterministic kernel)

    @property
    def key(self) -> str:
        return op_key(self.api)


def op_key(name: str) -> str:
    """A comparable key: `torch.Tensor.index_put_` -> `indexput`, `aten.index_put_.default` -> `indexput`."""
    name = name.removeprefix("aten.").removesuffix(".default")
    for prefix in _TORCH_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    name = name.split(".")[0]
    return re.sub(r"[^a-z0-9]", "", name.lower())


def node_keys(node_name: str) -> tuple[str, ...]:
    """Docstring keys an autograd Node stands for: `MaxPool3DWithIndicesBackward0` -> ('maxpool3d',)."""
    base = re.sub(r"Backward\d*$", "", node_name).replace("WithIndices", "").lower()
    if base.startswith("upsample"):
        return ("interpolate",)
    return _NODE_ALIASES.get(base, (base,))


def conv_key(dims: int, transposed: bool) -> str:
    """The docstring key of a convolution of this many spatial dimensions: `conv2d`, `convtranspose1d`."""
    return f"conv{'transpose' if transposed else ''}{dims}d"


def parse(doc: str) -> list[OpEntry]:
    """Every bullet of the docstring's two op lists (bullets may wrap onto following lines)."""
    entries: list[OpEntry] = []
    raises = open_bullet = False
    bullets: list[tuple[str, str, bool]] = []
    for line in (doc or "").splitlines():
        if "The following" in line and "will throw" in line:
            raises = True
        m = _BULLET.match(line)
        if m:
            bullets.append((m.group(1), m.group(2).strip(), raises))
            open_bullet = True
        elif not line.strip():
            open_bullet = False
        elif open_bullet and line.startswith(" " * 10):  # a bullet wrapped onto the next line
            api, rest, r = bullets[-1]
            bullets[-1] = (api, f"{rest} {line.strip()}", r)
    for api, rest, r in bullets:
        text = f"{api} {rest}".strip()
        devices = set()
        if re.search(r"\bCUDA\b", rest):
            devices.add("cuda")
        if re.search(r"\bCPU\b", rest):
            devices.add("cpu")
        backward = "differentiate" in rest or "requires grad" in rest
        conditions = tuple((k, v) for k, v in _QUOTED.findall(rest) if k in ("accumulate", "reduce", "mode"))
        if re.search(r"\bsparse", rest):  # `torch.bmm when called on sparse-dense CUDA tensors`
            conditions += (("layout", "sparse"),)
        entries.append(OpEntry(api.strip(), text, frozenset(devices), backward, conditions, r))
    return entries


def applies(entry: OpEntry, device: str, requires_grad: bool, values: dict[str, str]) -> bool:
    """Whether a call on `device` with these argument values is nondeterministic per `entry`.

    `values` maps an argument name to its value as text; a condition on an argument the caller did
    not report is taken to hold (the evidence over-reports rather than misses a listed call).
    """
    if entry.devices and device not in entry.devices:
        return False
    if entry.backward and not requires_grad:
        return False
    wanted: dict[str, set[str]] = {}
    for key, value in entry.conditions:
        wanted.setdefault(key, set()).add(value)
    return all(values[key] in options for key, options in wanted.items() if key in values)
