"""carried-state: a repeat read a file (or listed a directory) that an earlier repeat of the audit left.

The evidence is direct: the recorder saw the read, with its path and the user's line, and the file's
modification time falls between the audit's start and the repeat's (recorder/evidence/file_access.py).
A repeat that starts from another repeat's leftovers is not a rerun of the same computation: its
output may differ while every recorded tensor agrees (Lightning numbering its log directory
`version_N` after what it finds, in its progress line and in the checkpoint's `best_model_path`), or its
tensors may (an auto-resumed checkpoint, a cache).
"""

from __future__ import annotations

import posixpath  # path strings only (the detector reads no file)
from collections.abc import Sequence

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, RepeatEvidence, detects, finding
from detaudit.events import CarriedEvent, FileWriteEvent

MAX_LINES = 4


def carried(rep: RepeatEvidence, ctx: Context | None = None) -> list[CarriedEvent]:
    """A repeat's carried reads and listings (its DataLoader workers' too), before the divergence when
    `ctx` is given; reads and listings first, then the sizes and existence asked (`exists` before the `open`
    it guards: the read is what carried the state in)."""
    found = rep.of(CarriedEvent) + rep.workers(CarriedEvent)
    return sorted((e for e in found if ctx is None or ctx.precedes(e)), key=lambda e: e.get("what") == "stat")


def describe(index: int, event: CarriedEvent, written: Sequence[str] = ()) -> str:
    """One evidence line: what the repeat read, where, and what had changed there. `written`: the files the earlier
    repeats recorded writing; without one of them there, the change is only known to fall within the audit."""
    path = str(event.get("path"))
    if event.get("what") == "list":
        names = event.get("entries") or []
        who = "an earlier repeat of this audit" if any(_inside(w, path) for w in written) else _SOMEONE
        left = f"holding {', '.join(names)}, which {who} created or changed" if names \
            else f"which {who} changed (an entry added or removed)"
        what = f"listed directory {path}/, {left}"
    else:
        did = "read" if event.get("what") == "read" else "asked the size, time or existence of"
        who = "an earlier repeat of this audit wrote" if any(_same_file(w, path) or _inside(w, path) for w in written) \
            else f"was modified during this audit, before this repeat started ({_SOMEONE})"
        what = f"{did} {path}, which {who}"
    by = event.get("by", "")
    via = f" (through {by})" if by and by != event.get("loc") else ""
    return f"repeat {index} {what}, at {event.get('loc')}{via}"


_SOMEONE = "no earlier repeat recorded writing it: another process, or a write detaudit does not see"


def _same_file(written: str, path: str) -> bool:
    """A written path (absolute, as the script named it) is the read one (relative to the working directory)."""
    w, p = posixpath.normpath(written), posixpath.normpath(path)
    return w == p or w.endswith(posixpath.sep + p)


def _inside(written: str, directory: str) -> bool:
    """A written path lies somewhere under the listed directory (relative to the working directory)."""
    sep = posixpath.sep
    return f"{sep}{posixpath.normpath(directory)}{sep}" in f"{sep}{posixpath.normpath(written)}"


def _written_before(repeats: Sequence[RepeatEvidence], index: int) -> list[str]:
    """What the repeats run before repeat `index` recorded writing."""
    return [str(e.get("path")) for r in repeats if r.index < index for e in r.of(FileWriteEvent)]


def evidence_lines(repeats: Sequence[RepeatEvidence], everyone: Sequence[RepeatEvidence],
                   ctx: Context | None = None) -> list[str]:
    """The carried reads of the given repeats, the first few of each, as evidence lines (`everyone`: every
    compared repeat, whose recorded writes tell who changed what was read)."""
    lines: list[str] = []
    for rep in repeats:
        written = _written_before(everyone, rep.index)
        lines.extend(describe(rep.index, e, written) for e in carried(rep, ctx)[:MAX_LINES])
    return lines


def explains_output(ctx: Context) -> list[str] | None:
    """Evidence that carried state explains a difference in what the repeats were told to print or save
    (a stdout line, a checkpoint's path that is no tensor), or None.

    It does when every recorded tensor agrees (the caller's condition) and every repeat whose line or
    value differs read or listed state an earlier repeat left: the reference, run first, started from the
    directory as it was. A differing repeat without such a read is not explained, whatever others read.
    """
    differing = [r for r in ctx.involved if r is not ctx.ref]
    if not differing or not all(carried(r) for r in differing):
        return None
    return evidence_lines(differing, ctx.involved)


@detects(CauseId.CARRIED_STATE)
def carried_state(ctx: Context) -> Finding | None:
    """Direct evidence: before the divergence, a repeat involved read state another repeat left."""
    reading = [r for r in ctx.involved if carried(r, ctx)]
    if not reading:
        return None
    everyone = all(carried(r, ctx) for r in ctx.involved if r is not ctx.ref)
    lines = evidence_lines(reading, ctx.involved, ctx)
    lines.append("each repeat must start from the same state; this one started from what an earlier repeat "
                 "left, so it ran another computation")
    lines.append(f"first divergence: {ctx.where()}")
    first = carried(reading[0], ctx)[0]
    fix = (f"start every repeat from the same state: write to a fresh directory per run (or delete "
           f"{first.get('path')} before it), and do not resume from or cache into files a previous run left "
           f"(the read at {first.get('loc')}); a logger that numbers its runs (Lightning's `version_N`) takes "
           "a fixed `version=` or a per-run directory")
    return finding("carried-state", 0.85 if everyone else 0.6, "a repeat read state an earlier repeat left",
                   lines, fix, basis="direct")
