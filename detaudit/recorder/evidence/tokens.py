"""Token choices of a decode loop: which token each sequence got at each step, and by how much it won.

A call of `torch.argmax`, `torch.multinomial` or `torch.topk` (or their Tensor methods) that returns an integer
tensor of one index per row, shape (batch,) or (batch, 1) (topk's indices with k = 1), makes its call site a
candidate decode step. The site decodes once its choices come back as a model's next input, twice: after a
choice, the first module call whose first argument is an integer tensor with the batch's rows has, as the last
element of each row, the token chosen for it (`model(next_token[:, None], state)`,
`model(torch.cat([ids, next_token[:, None]], dim=1))`; Hugging Face's `generate` hands `input_ids` to the
model's embedding so). From then on every choice there is a `token` event (detaudit/events.py TokenEvent), the
site's first choices included: the ids, and for a choice by maximum (`argmax`, `topk`) the two largest scores of
each row, taken over the same dim. A site whose choices are not fed back within CANDIDATE_CHOICES calls (an
accuracy's `argmax` in a training loop) is dropped.

Cost: a script that chooses no index per row pays a dtype and shape check per call of the wrapped functions. A
candidate site keeps a module forward pre-hook installed (a list check per module call) until it is decided; a
decoding site pays a top-2 over its scores and a copy of its ids to the host per step (on an accelerator, a
synchronisation). At most MAX_ROWS sequences per step and MAX_EVENTS steps per process are recorded.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from detaudit.events import TokenEvent
from detaudit.recorder.evidence.base import Evidence, never_fatal
from detaudit.recorder.patch import wrap

CANDIDATE_CHOICES = 8  # a site's choices watched for being fed back before the site is dropped
FEEDS = 2  # choices fed back that make a site a decode step
MAX_ROWS = 256  # sequences of a batch recorded per step
MAX_EVENTS = 1 << 14  # token events per process (the trace keeps room for the rest of the evidence)
# (owner, name, label, position of `dim` counting the input, its default); None: a sample (no scores to read)
CHOOSERS = (("torch", "argmax", "torch.argmax", 1, None), ("Tensor", "argmax", "Tensor.argmax", 1, None),
            ("torch", "topk", "torch.topk", 2, -1), ("Tensor", "topk", "Tensor.topk", 2, -1),
            ("torch", "multinomial", "torch.multinomial", None, None),
            ("Tensor", "multinomial", "Tensor.multinomial", None, None))


class Site:
    """One call site's choices while it is a candidate, and what it was decided to be."""

    __slots__ = ("decodes", "dropped", "choices", "feeds", "pending", "waiting")

    def __init__(self) -> None:
        self.decodes = False
        self.dropped = False
        self.choices = 0
        self.feeds = 0
        self.pending: list[TokenEvent] = []  # the choices made before the site was known to decode
        self.waiting: Any = None  # the last choice's ids, until the next integer input says whether it was fed


class Tokens:
    """This process's decode sites, and the forward pre-hook that watches candidates' choices being fed back."""

    def __init__(self, ev: Evidence, torch: Any, topk: Callable[..., Any]) -> None:
        self.ev = ev
        self.torch = torch
        self._topk = topk  # the unwrapped Tensor.topk: the margins' own top-2 is no choice of the script's
        self.sites: dict[tuple[Any, int, str], Site] = {}
        self.watched: list[Site] = []  # candidates waiting for their last choice to be fed back
        self.hook: Any = None
        self.events = 0

    def dropped(self, caller: FrameType, label: str) -> bool:
        """The call site was found not to decode (or nothing more is recorded in this process)."""
        site = self.sites.get((caller.f_code, caller.f_lineno, label))
        return (site is not None and site.dropped) or self.events >= MAX_EVENTS

    def chose(self, label: str, dim_at: int | None, default_dim: int | None, args: tuple[Any, ...],
              kwargs: dict[str, Any], ids: Any, caller: FrameType) -> None:
        """A wrapped call returned `ids`, an integer tensor of one index per row: note it at its site."""
        key = (caller.f_code, caller.f_lineno, label)
        site = self.sites.get(key)
        if site is None:
            if self.ev.in_worker:
                return
            site = self.sites[key] = Site()
        event = self._event(label, caller, site.choices, ids, self._scores(dim_at, default_dim, args, kwargs, ids))
        site.choices += 1
        if site.decodes:
            self._emit(event)
            return
        if site.waiting is not None:  # its last choice met no integer input before this one: not fed
            self._unwatch(site)
        site.pending.append(event)
        if site.choices > CANDIDATE_CHOICES:
            site.dropped, site.pending = True, []
            self._unhook_if_idle()
            return
        site.waiting = ids.detach().reshape(-1).clone()
        self.watched.append(site)
        if self.hook is None:
            from torch.nn.modules import module as nn_module

            self.hook = nn_module.register_module_forward_pre_hook(self._on_forward_pre)

    def _scores(self, dim_at: int | None, default_dim: int | None, args: tuple[Any, ...], kwargs: dict[str, Any],
                ids: Any) -> list[list[float] | None] | None:
        """Each row's two largest scores over the dim the choice was made over (None: a sample, or a dim other than
        the last, or fewer than two scores)."""
        if dim_at is None or kwargs.get("largest", True) is False:
            return None
        scores = args[0] if args else kwargs.get("input")
        dim = args[dim_at] if len(args) > dim_at else kwargs.get("dim", default_dim)
        torch = self.torch
        if not isinstance(scores, torch.Tensor) or not isinstance(dim, int) or scores.dim() == 0 \
                or dim not in (-1, scores.dim() - 1) or scores.shape[-1] < 2:
            return None
        rows = ids.shape[0]
        if scores.numel() != rows * scores.shape[-1] or not (scores.is_floating_point()):
            return None
        with torch.no_grad():
            top = self._topk(scores.detach().reshape(rows, -1)[:MAX_ROWS].float(), 2, -1).values.tolist()
        return [[a, b] if math.isfinite(a) and math.isfinite(b) else None for a, b in top]

    def _event(self, label: str, caller: FrameType, n: int, ids: Any,
               top2: list[list[float] | None] | None) -> TokenEvent:
        ev = self.ev
        event = TokenEvent(type="token", fn=label, loc=ev.where(caller), site=ev.site(caller), n=n,
                           rows=int(ids.shape[0]), ids=ids.reshape(-1)[:MAX_ROWS].tolist(), top2=top2)
        event["at"] = int(getattr(ev.recorder, "next_index", 0))
        return event

    def _emit(self, event: TokenEvent) -> None:
        self.events += 1
        self.ev.emit(event)

    def _on_forward_pre(self, module: Any, args: tuple[Any, ...]) -> None:
        """The first module call with an integer tensor of a watched site's rows says whether its choice was fed."""
        if not self.watched or not args:
            return
        given = args[0]
        torch = self.torch
        if not isinstance(given, torch.Tensor) or given.numel() == 0 or given.is_floating_point() \
                or given.is_complex() or given.dtype == torch.bool or self.ev.compiling():
            return
        for site in [s for s in self.watched if s.waiting.shape[0] == given.shape[0]]:
            with never_fatal():
                last = given.reshape(given.shape[0], -1)[:, -1]
                fed = last.device == site.waiting.device and bool(torch.equal(last, site.waiting))
                self._unwatch(site)
                if fed:
                    self._fed(site)

    def _fed(self, site: Site) -> None:
        site.feeds += 1
        if site.feeds < FEEDS:
            return
        site.decodes = True
        for event in site.pending:
            if self.events < MAX_EVENTS:
                self._emit(event)
        site.pending = []
        self._unhook_if_idle()

    def _unwatch(self, site: Site) -> None:
        site.waiting = None
        self.watched.remove(site)
        self._unhook_if_idle()

    def _unhook_if_idle(self) -> None:
        """No candidate left to decide: the forward pre-hook goes (a later candidate installs it again)."""
        if self.hook is not None and not self.watched \
                and all(s.decodes or s.dropped for s in self.sites.values()):
            self.hook.remove()
            self.hook = None


def install(ev: Evidence, torch: Any) -> Tokens:
    """Wrap the choosers (before the draws' wrappers: evidence/__init__.py)."""
    tokens = Tokens(ev, torch, torch.Tensor.topk)
    owners = {"torch": torch, "Tensor": torch.Tensor}
    for owner, name, label, dim_at, default_dim in CHOOSERS:
        wrap(owners[owner], name, _chooser(tokens, label, dim_at, default_dim))
    return tokens


def _caller(ev: Evidence) -> FrameType | None:
    """The frame that called the chooser, past detaudit's own (the draws' wrapper of multinomial stands outside
    this one, so that it keys draws by the script's line); None when detaudit itself chose."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and ev.own(frame):
        frame = frame.f_back
    return frame


def _chooser(tokens: Tokens, label: str, dim_at: int | None,
             default_dim: int | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    torch, ev = tokens.torch, tokens.ev
    long = torch.int64
    indices = label.endswith("topk")

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def choose(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            ids = result[1] if indices else result  # topk: (values, indices)
            if type(ids) is not torch.Tensor or ids.dtype != long:
                return result
            shape = ids.shape
            if not (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)) or shape[0] == 0:
                return result
            caller = _caller(ev)
            # a site found not to decode costs no more than this lookup
            if caller is None or tokens.dropped(caller, label) or ev.compiling():
                return result
            with never_fatal():
                tokens.chose(label, dim_at, default_dim, args, kwargs, ids, caller)
            return result

        return choose

    return make
