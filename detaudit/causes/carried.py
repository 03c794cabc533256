"""carried-state: a repeat read a file (or listed a directory) that an earlier repeat of the audit left.

The evidence is direct: the recorder saw the read, with its path and the user's line, and the file's
modification time falls between the audit's start and the repeat's; or the bytes it held at that read
differ from the reference's at the same read, and this repeat did not write them afresh first (a session
log the script appends to and reads back: its own append moved the time past the repeat's start)
(recorder/evidence/file_access.py).
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
from detaudit.events import CarriedEvent, FileReadEvent, FileWriteEvent, select

MAX_LINES = 4


def carried(rep: RepeatEvidence, ctx: Context | None = None) -> list[CarriedEvent]:
    """A repeat's carried reads and listings (its DataLoader workers' too), before the divergence when
    `ctx` is given; reads and listings first, then the sizes and existence asked (`exists` before the `open`
    it guards: the read is what carried the state in)."""
    found = rep.of(CarriedEvent) + rep.workers(CarriedEvent)
    return sorted((e for e in found if ctx is None or ctx.precedes(e)), key=lambda e: e.get("what") == "stat")


def changed_reads(rep: RepeatEvidence, ref: RepeatEvidence,
                  ctx: Context | None = None) -> list[tuple[FileReadEvent, FileReadEvent]]:
    """(this repeat's read, the reference's read of the same file at the same line) where the bytes differ, before
    the divergence when `ctx` is given; a read of a file this repeat had truncated and written first is left out
    (its bytes were made in this run, from whatever made them differ)."""
    theirs = {(e["path"], e["loc"]): e for e in reversed(ref.of(FileReadEvent) + ref.workers(FileReadEvent))}
    pairs = []
    for e in rep.of(FileReadEvent) + rep.workers(FileReadEvent):
        other = theirs.get((e["path"], e["loc"]))
        if other is None or other["digest"] == e["digest"] or (ctx is not None and not ctx.precedes(e)):
            continue
        if not any(not w.get("append") for w in own_writes(rep, e)):
            pairs.append((e, other))
    return pairs


def own_writes(rep: RepeatEvidence, read: FileReadEvent) -> list[FileWriteEvent]:
    """This repeat's opens for writing of the file it read, before the read (a worker's read: any of the main
    process's, which started before the worker)."""
    cut = next((k for k, e in enumerate(rep.events) if e is read), len(rep.events))
    return [w for w in select(rep.events[:cut], FileWriteEvent) if _same_file(w["path"], read["path"])]


def describe_read(rep: RepeatEvidence, ref: RepeatEvidence, pair: tuple[FileReadEvent, FileReadEvent],
                  written: Sequence[str]) -> str:
    """One evidence line: a read whose bytes differ from the reference's, and who changed them."""
    read, other = pair
    path = read["path"]
    appended = [w["loc"] for w in own_writes(rep, read) if w.get("append")]
    if appended:
        who = f"the script appends to it at {appended[0]} and reads it back, so each run reads what the runs " \
              "before it added"
    elif any(_same_file(w, path) for w in written):
        who = "an earlier repeat of this audit wrote it"
    else:
        who = _SOMEONE
    return (f"repeat {rep.index} read {path} at {read['loc']} holding other bytes than repeat {ref.index} read there "
            f"({_amount(read)} against {_amount(other)}): {who}")


def _amount(read: FileReadEvent) -> str:
    lines = read["lines"]
    return (f"{lines} line{'s' * (lines != 1)}, " if lines >= 0 else "") + f"{read['size']} bytes"


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
    ref = everyone[0]
    for rep in repeats:
        written = _written_before(everyone, rep.index)
        found = carried(rep, ctx)[:MAX_LINES]
        lines.extend(describe(rep.index, e, written) for e in found)
        seen = {e.get("path") for e in found}
        lines.extend(describe_read(rep, ref, pair, written) for pair in changed_reads(rep, ref, ctx)[:MAX_LINES]
                     if pair[0]["path"] not in seen)
    return lines


def carries(rep: RepeatEvidence, ref: RepeatEvidence, ctx: Context | None = None) -> bool:
    """The repeat read or listed state an earlier repeat left, or a file holding other bytes than the reference's."""
    return bool(carried(rep, ctx) or changed_reads(rep, ref, ctx))


def explains_output(ctx: Context) -> list[str] | None:
    """Evidence that carried state explains a difference in what the repeats were told to print or save
    (a stdout line, a checkpoint's path that is no tensor), or None.

    It does when every recorded tensor agrees (the caller's condition) and every repeat whose line or
    value differs read or listed state an earlier repeat left: the reference, run first, started from the
    directory as it was. A differing repeat without such a read is not explained, whatever others read.
    """
    differing = [r for r in ctx.involved if r is not ctx.ref]
    if not differing or not all(carries(r, ctx.ref) for r in differing):
        return None
    return evidence_lines(differing, ctx.involved)


@detects(CauseId.CARRIED_STATE)
def carried_state(ctx: Context) -> Finding | None:
    """Direct evidence: before the divergence, a repeat involved read state another repeat left."""
    reading = [r for r in ctx.involved if carries(r, ctx.ref, ctx)]
    if not reading:
        return None
    everyone = all(carries(r, ctx.ref, ctx) for r in ctx.involved if r is not ctx.ref)
    lines = evidence_lines(reading, ctx.involved, ctx)
    lines.append("each repeat must start from the same state; this one started from what an earlier repeat "
                 "left, so it ran another computation")
    lines.append(f"first divergence: {ctx.where()}")
    return finding("carried-state", 0.85 if everyone else 0.6, "a repeat read state an earlier repeat left",
                   lines, _fix(reading[0], ctx), basis="direct")


def _fix(rep: RepeatEvidence, ctx: Context) -> str:
    """The code change, at the first carried read of the first repeat that made one."""
    first = next(iter(carried(rep, ctx)), None)
    if first is not None:
        path, loc = first.get("path"), first.get("loc")
    else:
        read = changed_reads(rep, ctx.ref, ctx)[0][0]
        appended = [w["loc"] for w in own_writes(rep, read) if w.get("append")]
        if appended:
            return (f"do not carry a value from run to run through {read['path']}: the script appends to it (at "
                    f"{appended[0]}) and reads it back (at {read['loc']}), so each run starts from what every run "
                    "before it left; take the value from this run's own configuration, or start the file afresh "
                    "in each run (mode 'w', or a fresh path per run)")
        path, loc = read["path"], read["loc"]
    return (f"start every repeat from the same state: write to a fresh directory per run (or delete "
            f"{path} before it), and do not resume from or cache into files a previous run left "
            f"(the read at {loc}); a logger that numbers its runs (Lightning's `version_N`) takes "
            "a fixed `version=` or a per-run directory")
