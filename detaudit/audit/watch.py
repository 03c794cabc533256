"""`detaudit watch`: run the script once, with its checked steps replayed in the process (recorder/replay.py).

The job is one repeat of `run` at step granularity with a `watch` entry in its child config. While it runs,
its standard output is passed through to ours byte for byte and its standard error to ours (a job's log:
detaudit's own lines go to standard error only), and a one-line status is written every `status_every` steps
or seconds and at each mismatch. The report is built from the events file the job appended to (run/watchlog.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from detaudit.audit.against import Reference, changes, first_difference, follow, load_reference
from detaudit.audit.pipeline import ended
from detaudit.audit.watch_replicas import ReplicaWatch
from detaudit.compare.live import Follower
from detaudit.errors import OutputError, TraceError
from detaudit.report.model import ReplicaDivergence
from detaudit.report.watch_model import BACKWARD_STEPS, Against, WatchReport, WatchSettings
from detaudit.run import distributed
from detaudit.run.devices import resolve_devices
from detaudit.run.distributed import Layout, node_rank, rank_config
from detaudit.run.files import write_text_atomically
from detaudit.run.launcher import Interrupted, Launcher, RepeatPlan, check_script, plan_repeats, request_stop
from detaudit.run.rundir import new_run_dir
from detaudit.run.watchlog import Mismatch, before_text, merged, read_watch_log
from detaudit.trace.reader import read_events

EVENTS_FILE = "watch-events.jsonl"
HANDSHAKE_FILE = "watch-checked.json"  # how far the parent's checks got, for a torch.save to wait on
_ALL_STEPS = 1 << 62
SAVE_PATIENCE_S = 60.0  # the longest a torch.save waits for the parent's checks (then it is written unchecked)


class Relay:
    """Passes the job's output through while it runs and writes the status lines (launcher.Watch).

    `outputs`: each capture file and where it goes (under torchrun: torchrun's own, and each rank's standard
    output, passed on in whole lines so that ranks never split each other's lines); `events`: the events files,
    the lowest rank's first (its steps drive the status line); `follower`: --against's live comparison;
    `replicas`: the live replica check under torchrun (its ranks in the order of `events`). `clock`: seconds, for
    a status every so many seconds. `handshake`: the file a torch.save in the job waits on (recorder/save_gate.py):
    how far the follower's or the replicas' comparison got, and where it found a difference.
    """

    def __init__(self, events: Sequence[Path], settings: WatchSettings, status: Callable[[str], None],
                 outputs: Sequence[tuple[Path, BinaryIO, bool]], follower: Follower | None = None,
                 replicas: ReplicaWatch | None = None, clock: Callable[[], float] = time.monotonic,
                 handshake: Path | None = None) -> None:
        self.events = list(events)
        self.handshake = handshake
        self.ended = [-1] * len(self.events)  # the last step each events file said ended
        self.told: tuple[int, int | None] | None = None  # what the handshake file says
        self.follower = follower
        self.replicas = replicas
        self.diverged_at: int | None = None
        self.settings = settings
        self.status = status
        self.outputs = list(outputs)
        self.offsets: dict[Path, int] = {}
        self.clock = clock
        self.last_status = clock()
        self.step = 0  # steps the lowest rank completed
        self.checked = 0
        self.mismatches = 0

    def configure(self, plan: RepeatPlan) -> dict[str, Any]:
        return {}

    def poll(self, plan: RepeatPlan, final: bool) -> None:
        for path, sink, whole_lines in self.outputs:
            self._pass_on(path, sink, whole_lines and not final)
        for n, events in enumerate(self.events):
            for event in self._new_events(events):
                self._on_event(event, n)
        ended = min(self.ended, default=-1)  # read before the traces: every record of these steps is in them
        if self.diverged_at is None:
            self._follow(plan, final)
        self._tell(ended, final)
        cadence = self.settings.status_every
        if cadence.unit == "seconds" and not final:
            now = self.clock()
            if now - self.last_status >= cadence.every:
                self.last_status = now
                self._status()

    def _follow(self, plan: RepeatPlan, final: bool) -> None:
        """Compare what the traces hold (with the reference's, the ranks' with each other); at the first
        difference say so and, unless told to continue, ask the job to stop at a step boundary after it
        (every rank at the same one, recorder/agree.py)."""
        what = "differs from the reference"
        if self.follower is not None:
            self.follower.poll()
            self.diverged_at = self.follower.diverged_at
        if self.diverged_at is None and self.replicas is not None:
            found = self.replicas.poll(final)
            if found is not None:
                self.diverged_at = found.step
                what = f"DDP replica {found.name} differs on rank {found.ranks[0]} from rank {found.reference}"
        if self.diverged_at is None:
            return
        self.mismatches += 1
        self.status(f"detaudit watch: {what} at step {self.diverged_at}")
        if self.settings.on_mismatch == "stop" and not final:
            try:
                request_stop(plan, self.diverged_at + 1, self.diverged_at)
            except OutputError:  # the run directory went away: the launcher says so when the job ends
                return

    def _read_new(self, path: Path, whole_lines: bool) -> bytes:
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets.get(path, 0))
                data = fh.read()
        except FileNotFoundError:
            return b""
        if whole_lines:
            data = data[:data.rfind(b"\n") + 1]
        self.offsets[path] = self.offsets.get(path, 0) + len(data)
        return data

    def _pass_on(self, path: Path, sink: BinaryIO, whole_lines: bool) -> None:
        data = self._read_new(path, whole_lines)
        if data:
            sink.write(data)
            sink.flush()

    def _new_events(self, path: Path) -> list[dict[str, Any]]:
        events = []
        for line in self._read_new(path, whole_lines=True).splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    def _tell(self, ended: int, final: bool) -> None:
        """Update the handshake file: the steps compared (up to the last one every events file said ended, and
        the comparison's own progress; all, once it can follow no further) and the first difference."""
        if self.handshake is None or final:
            return
        progress = [live.agrees_to for live in (self.follower, self.replicas) if live is not None]
        if self.replicas is not None and self.replicas.broken:
            progress = [_ALL_STEPS]  # no comparison to wait for
        checked = min([ended, *(-1 if agreed is None else agreed for agreed in progress)])
        told = (checked, self.diverged_at)
        if told == self.told:
            return
        try:
            write_text_atomically(self.handshake, json.dumps({"checked_to": told[0], "mismatch_at": told[1]}),
                                  mode=0o600)
        except OutputError:  # the run directory went away: the launcher says so when the job ends
            return
        self.told = told

    def _on_event(self, event: dict[str, Any], n: int) -> None:
        """An event of the `n`-th events file (0: the lowest rank's)."""
        kind = event.get("event")
        if kind == "step":
            self.ended[n] = max(self.ended[n], int(event.get("step", -1)))
            if self.replicas is not None:
                self.replicas.step_ended(list(self.replicas.paths)[n], self.ended[n])
        if kind == "step" and n == 0:
            self.checked += bool(event.get("checked"))
            self.step = int(event.get("step", 0)) + 1
            cadence = self.settings.status_every
            if cadence.unit == "steps" and self.step % cadence.every == 0:
                self._status()
        elif kind == "mismatch":
            self.mismatches += 1
            found = Mismatch.from_json(event)
            self.status(f"detaudit watch: MISMATCH at step {found.step}: {found.op} at {found.location or '?'} "
                        f"(max |diff| {found.max_abs_diff:.3g}, {found.max_ulp} ULP)")
        elif kind == "boundary" and n == 0:
            self.status(f"detaudit watch: {BACKWARD_STEPS}")
        elif kind == "stopped":
            self.status(f"detaudit watch: stopped the job before {before_text(str(event.get('before')))}")
        elif kind == "unchecked_save":
            self.status(f"detaudit watch: torch.save to {event.get('target')} at step {event.get('step')} went ahead "
                        f"before the check had caught up (it waited {event.get('waited_s')} s)")

    def _status(self) -> None:
        """The one-line status: steps done and checked, mismatches, how far the live comparison agrees."""
        line = (f"detaudit watch: step {self.step}, {self.checked} checked, {self.mismatches} "
                f"mismatch{'es' if self.mismatches != 1 else ''}")
        if self.follower is not None and self.diverged_at is None:
            agreed = self.follower.agrees_to
            line += "; against the reference: " + ("nothing compared yet" if agreed is None
                                                    else f"agrees up to step {agreed}")
        if self.replicas is not None and self.diverged_at is None:
            agreed = self.replicas.agrees_to
            line += "; DDP replicas: " + ("nothing compared yet" if agreed is None else f"agree up to step {agreed}")
        self.status(line)


def run_watch(script: str, script_args: list[str], out_dir: Path | None, settings: WatchSettings,
              status: Callable[[str], None]) -> WatchReport:
    """Run the script once under watch and report; `status` takes the lines for standard error."""
    check_script(Path(script))
    reference = load_reference(settings.against) if settings.against is not None else None
    run_dir = new_run_dir(Path(script), out_dir)
    events = run_dir / EVENTS_FILE
    nproc = settings.nproc_per_node
    layout = Layout(nproc, node_rank(list(settings.torchrun_args))) if nproc else None
    parent_checks = reference is not None or layout is not None
    handshake = run_dir / HANDSHAKE_FILE if parent_checks else None
    config = {"watch": {"events": str(events), "every": settings.every, "on_mismatch": settings.on_mismatch,
                        **({"handshake": str(handshake), "save_patience_s": SAVE_PATIENCE_S} if handshake else {})},
              **rank_config(nproc)}
    device = resolve_devices(["auto"])[0]
    plan = plan_repeats(run_dir, 1, [device], reference.granularity if reference is not None else "step",
                        child_config=config, prefix="watch", own_device=True,
                        stoppable=parent_checks)[0]
    ranks = _local_ranks(layout)
    follower = follow(reference, plan.trace) if reference is not None else None
    replicas = ReplicaWatch({r: plan.trace.with_name(Layout.rank_file(plan.trace.name, r)) for r in ranks}) \
        if layout is not None else None
    relay = Relay(_rank_files(events, ranks), settings, status, _outputs(plan, ranks), follower, replicas,
                  handshake=handshake)
    launcher = distributed.launcher(nproc, list(settings.torchrun_args), script, script_args, settings.timeout, 1,
                                    None, watch=relay) or Launcher(script, script_args, settings.timeout, watch=relay)
    try:
        result = ended(launcher.run([plan])[0], run_dir, layout)
    except Interrupted as exc:
        exc.run_dir = run_dir
        raise
    finally:
        for live in (follower, replicas):
            if live is not None:
                live.close()
    against = None if reference is None else _against(reference, script, script_args, plan.trace, device,
                                                      follower)
    logs = [read_watch_log(path, rank) for path, rank in zip(_rank_files(events, ranks), ranks)] if ranks \
        else [read_watch_log(events)]
    traces = [plan.trace.with_name(Layout.rank_file(plan.trace.name, r)) for r in ranks] if ranks else [plan.trace]
    return WatchReport(script, str(run_dir), settings, result, merged(logs), against,
                       None if replicas is None else _replica_mismatch(replicas.found),  # after the relay's last poll
                       compiled=_compiled(traces))


def _compiled(traces: Sequence[Path]) -> tuple[str, ...]:
    """What ran compiled in the watched job, from its traces' compile evidence: the compiled modules by name, or
    `compiled code` where dynamo compiled frames no module was seen for. The replay re-executes none of it."""
    modules: list[str] = []
    frames = False
    for path in traces:
        try:
            found = read_events(path, "compile")
        except (TraceError, OSError):  # no trace (the job died before torch): nothing seen compiled
            continue
        for event in found:
            module = event.get("module")
            if isinstance(module, str) and module not in modules:
                modules.append(module)
            frames = frames or bool(event.get("frames"))
    return tuple(modules) if modules else ("compiled code",) if frames else ()


def _local_ranks(layout: Layout | None) -> list[int]:
    """The ranks this node launches (none for a single process)."""
    if layout is None:
        return []
    first = (layout.node_rank or 0) * layout.nproc_per_node
    return list(range(first, first + layout.nproc_per_node))


def _rank_files(path: Path, ranks: list[int]) -> list[Path]:
    """A file of the job, or each rank's copy of it under torchrun (lowest rank first)."""
    return [path.with_name(Layout.rank_file(path.name, r)) for r in ranks] if ranks else [path]


def _outputs(plan: RepeatPlan, ranks: list[int]) -> list[tuple[Path, BinaryIO, bool]]:
    """The captures passed through: the job's standard output and error (torchrun's own, under torchrun), and
    each rank's standard output in whole lines."""
    out, err = sys.stdout.buffer, sys.stderr.buffer
    return [(plan.stdout, out, False), (plan.stderr, err, False),
            *((path, out, True) for path in (_rank_files(plan.stdout, ranks) if ranks else []))]


def _replica_mismatch(found: ReplicaDivergence | None) -> Mismatch | None:
    if found is None:
        return None
    return Mismatch(found.step, found.name, None, None, None, found.max_abs_diff or 0.0, 0, None, "replica",
                    found.ranks[0])


def _against(reference: Reference, script: str, script_args: list[str], trace: Path, device: str,
             follower: Follower | None) -> Against:
    difference = first_difference(reference, trace)
    agreed = None if follower is None else follower.agrees_to
    return Against(str(reference.given), agreed, difference,
                   tuple(changes(reference, script, script_args, trace, device)))
