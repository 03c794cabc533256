"""Evidence only a rank has: which parameters DDP keeps as replicas, and how its data is sharded.

Installed only in the ranks of a torchrun repeat. Events (trace `events`, docs/distributed.md):
- `ddp`: a DistributedDataParallel wrapper was built: the parameter names it keeps identical on
  every rank (as the hooks name them: `module.fc.weight`), the names it ignores, and its reducer
  settings (bucket size, gradient views, static graph), which fix the all-reduce order, and the
  buffers it broadcasts from rank 0 before each forward;
- `sampler-epoch`: a shuffling DistributedSampler iterated again at an epoch it already used
  (`set_epoch` not called): the same order every epoch, deterministic but rarely what was meant.

init_process_group and the Python-level collectives are recorded by recorder/evidence/kernels.py as
`collective` events (every run); DDP's own all-reduces run in C++ and are described by `ddp`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from detaudit.events import DdpEvent, SamplerEpochEvent
from detaudit.recorder import location
from detaudit.recorder.core import Recorder
from detaudit.recorder.patch import wrap


def _where() -> str:
    frame = location.user_frame(3)
    return "" if frame is None else f"{location.display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def install(recorder: Recorder) -> None:
    """Patch DDP construction and DistributedSampler iteration (for the life of the rank)."""
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    from torch.nn.parallel import distributed as ddp_module

    def backend(group: Any = None) -> str | None:
        try:
            return str(dist.get_backend(group))
        except Exception:  # not initialised, or a group this rank is not in
            return None

    def make(original_init: Callable[..., None]) -> Callable[..., None]:
        def ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            ignored = sorted(getattr(self, "parameters_to_ignore", ()) or ())
            names = [n for n, _ in self.named_parameters() if n.removeprefix("module.") not in ignored]
            recorder.event(DdpEvent(
                type="ddp", loc=_where(), params=names, ignored=ignored,
                backend=backend(getattr(self, "process_group", None)),
                bucket_cap_mb=kwargs.get("bucket_cap_mb"),
                gradient_as_bucket_view=bool(getattr(self, "gradient_as_bucket_view", False)),
                static_graph=bool(getattr(self, "static_graph", False)),
                find_unused_parameters=bool(getattr(self, "find_unused_parameters", False)),
                buffers=[n for n, _ in self.named_buffers()] if getattr(self, "broadcast_buffers", False) else [],
            ))

        return ddp_init

    wrap(ddp_module.DistributedDataParallel, "__init__", make)

    _watch_sampler_epochs(recorder)


def _watch_sampler_epochs(recorder: Recorder) -> None:
    from torch.utils.data import distributed as data_distributed

    used: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()  # sampler -> epochs iterated
    told: weakref.WeakSet[Any] = weakref.WeakSet()

    def make(original_iter: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def sampler_iter(self: Any) -> Any:
            epochs = used.setdefault(self, set())
            epoch = int(getattr(self, "epoch", 0))
            if getattr(self, "shuffle", False) and epoch in epochs and self not in told:
                told.add(self)
                recorder.event(SamplerEpochEvent(type="sampler-epoch", loc=_where(), epoch=epoch,
                                                 seed=getattr(self, "seed", None), iterations=len(epochs) + 1))
            epochs.add(epoch)
            return original_iter(self)

        return sampler_iter

    wrap(data_distributed.DistributedSampler, "__iter__", make)
