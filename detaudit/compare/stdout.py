"""Comparing what the repeats print: line by line, with volatile tokens masked (docs/stdout.md).

Scripts print timings, throughput, progress bars, timestamps, pids and object addresses; these
change in every run of a perfectly deterministic script. `masked` (the default) replaces them with
placeholders before comparing, `strict` compares the bytes, `ignore` does not compare stdout.
The rules mask only numbers tied to a time or throughput unit or word, never a bare number, so
`loss 0.1234` or `acc 93.5%` still count. Reads the repeats' stdout files a line at a time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union, get_args

StdoutMode = Literal["strict", "masked", "ignore"]
STDOUT_MODES: tuple[str, ...] = get_args(StdoutMode)
DEFAULT_STDOUT: StdoutMode = "masked"
SHOWN_CHARS = 240  # a line shown in a report is cut to this many characters

_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"  # 1,234.5 too
_CLOCK = r"(?<!\d)\d{1,6}:\d{2}(?::\d{2})?(?:\.\d+)?"
# words whose value is a time or a speed whatever its unit (`step_time 3.2`, `mfu 41.2%`, `eta 0:12`)
_WORDS = r"(?:time|runtime|elapsed|eta|mfu|throughput|duration|took|latency|[A-Za-z_]{0,40}?per_sec(?:ond)?)"
_RATE = r"(?:[A-Za-z]+/s(?:ec)?|(?:m?s|sec)/[A-Za-z]+)"
# units of time, and rates "something per second" / "seconds per something"
_PLAIN = r"(?:ms|us|µs|ns|s|sec|secs|seconds?|mins?|minutes?|hrs?|hours?)"
_UNIT = r"(?:" + _RATE + "|" + _PLAIN + ")"  # a rate first: `ms/step` is one unit
# units that also serve as a column label before their value (`ms=12`); not `min`/`s`: `min: -0.01` is a result
_LABEL = r"(?:ms|us|µs|ns|secs?|seconds)"
# after a spaced rate, what makes it the label of the number that follows instead of the suffix of the one
# before (`acc 0.91 sec/it 0.5`): a `:`/`=`, or a number with no unit of its own (`#`: one a header rule masked).
# A plain time unit labels the next number only with `:`/`=` (`loss=0.51 ms=12`; `41.2 ms 0.5123` is a suffix)
_RATE_LABELS_NEXT = rf"(?=\s*[:=]|\s+#|\s+{_NUM}(?!\s?{_UNIT}(?![\w/]))(?![\w.,]))"

_Replacement = Union[str, Callable[["re.Match[str]"], str]]  # a runtime alias: no `|` before Python 3.10
_RULES: tuple[tuple[re.Pattern[str], _Replacement], ...] = (
    # ANSI colour / cursor escapes (progress bars, coloured loggers)
    (re.compile(r"\x1b\[[0-9;?]*[A-Za-z]"), ""),
    # wall-clock timestamps: ISO 8601 and logging's asctime (`2026-11-22 23:58:05,123`), with zone
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"), "<timestamp>"),
    # progress-bar elapsed<remaining (`[00:01<00:02, 19.5it/s]`)
    (re.compile(rf"{_CLOCK}<(?:{_CLOCK}|\?)"), "<elapsed>"),
    # a time of day or a duration as h:mm:ss
    (re.compile(r"(?<![\d:])\d{1,2}:\d{2}:\d{2}(?:\.\d+)?(?![\d:])"), "<clock>"),
    # object addresses (`<Foo object at 0x7f3a...>`) and process ids
    (re.compile(r"0x[0-9a-fA-F]+"), "0x#"),
    (re.compile(r"(?i)(?<![A-Za-z])(pid)(\s*[:=#]?\s*)\d+"), r"\1\2#"),
    # a compound duration (`1m02s`, `2h03m`, `1h2m3.5s`)
    (re.compile(r"(?<![\w.])(?:\d+h\d+m(?:\d+(?:\.\d+)?s)?|\d+m\d+(?:\.\d+)?s)(?!\w)"), "#"),
    # a timing word, then its value: a clock, or a number with or without a unit or %
    (re.compile(rf"(?i)((?<![A-Za-z]){_WORDS}(?![A-Za-z])(?:\s+per\s+[A-Za-z_]{{1,20}})?['\"]?\s*"
                rf"(?:\([^)]{{0,20}}\))?\s*[:=]?\s*)"
                rf"(?:{_CLOCK}|{_NUM})(\s?(?:%|{_UNIT})(?!\w))?"),
     lambda m: m.group(1) + "#" + (m.group(2) or "")),
    # a rate as a column header before its value (`tok/s: 1234`, `sec/it 0.5`), a time unit as one (`ms=12`); a
    # value with a unit of its own is not the header's (`1200 tokens/s 3.1 samples/s`)
    (re.compile(rf"((?<![A-Za-z])(?:{_RATE}(?![A-Za-z])\s*[:=]?|(?<![\w.]){_LABEL}(?![A-Za-z/])\s*[:=])\s*)"
                rf"{_NUM}(?!\s?{_UNIT}(?![\w/]))(?![\w.,])"), r"\1#"),
    # a number with a time or rate unit (`14.20ms`, `0.82 s`, `19.5it/s`, `1200 tokens/s`) — spaced, only where the
    # unit is not the label of what follows — and tqdm's `?it/s`
    (re.compile(rf"(?<![\w.#]){_NUM}({_UNIT})(?![\w/])"), r"#\1"),
    (re.compile(rf"(?<![\w.#]){_NUM}(\s{_RATE})(?![\w/])(?!{_RATE_LABELS_NEXT})"), r"#\1"),
    (re.compile(rf"(?<![\w.#]){_NUM}(\s{_PLAIN})(?![\w/])(?!\s*[:=])"), r"#\1"),
    (re.compile(r"\?(?=\s?(?:it/s|s/it)\b)"), "#"),
)


def visible(line: str) -> str:
    """What a terminal shows of a line written with carriage returns: its last non-empty segment."""
    if "\r" not in line:
        return line
    parts = [p for p in line.split("\r") if p]
    return parts[-1] if parts else ""


def mask_line(line: str) -> str:
    """A line with its volatile tokens replaced by placeholders (rules: docs/stdout.md)."""
    text = visible(line)
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


@dataclass(frozen=True)
class StdoutDifference:
    """The first stdout line where some repeat differs from the reference repeat.

    `lines` maps a repeat to its text of that line as printed (None: its output had ended);
    line numbers count from 1.
    """

    line: int
    mode: StdoutMode
    reference: int
    lines: dict[int, str | None]

    @property
    def repeats(self) -> list[int]:
        return [i for i in self.lines if i != self.reference]


def _lines(path: Path) -> Iterator[str]:
    """A file's lines split on `\\n` only (a `\\r` progress update stays inside its line)."""
    from detaudit.trace import open_regular

    # a file of a run directory: regular, never followed through a symlink planted there
    with open_regular(path, "stdout capture", follow_symlinks=False) as fh:
        for raw in fh:
            yield raw.rstrip(b"\n").decode("utf-8", errors="replace")


def _key(line: str | None, mode: StdoutMode) -> str | None:
    return line if line is None or mode == "strict" else mask_line(line)


def first_difference(reference: Path, other: Path, mode: StdoutMode) -> tuple[int, str | None, str | None] | None:
    """(line number, reference's line, other's line) of the first line that differs under `mode`."""
    ref_lines, other_lines = _lines(reference), _lines(other)
    number = 0
    while True:
        number += 1
        a, b = next(ref_lines, None), next(other_lines, None)
        if a is None and b is None:
            return None
        if a != b and _key(a, mode) != _key(b, mode):  # equal lines mask alike: only differing ones are masked
            return number, a, b


def compare_stdout(paths: Sequence[Path], indices: Sequence[int], mode: StdoutMode) -> StdoutDifference | None:
    """Compare each repeat's stdout file with the first one's; the earliest differing line, or None.

    `indices` are the repeats the paths belong to. Every repeat that differs on that same line is
    listed; the others may differ later.
    """
    if mode == "ignore" or len(paths) < 2:
        return None
    found: dict[int, tuple[int, str | None, str | None]] = {}
    for path, index in zip(paths[1:], indices[1:]):
        diff = first_difference(paths[0], path, mode)
        if diff is not None:
            found[index] = diff
    if not found:
        return None
    line = min(d[0] for d in found.values())
    at_line = {i: d for i, d in found.items() if d[0] == line}
    ref_text = next(iter(at_line.values()))[1]
    lines = {indices[0]: cut_text(ref_text), **{i: cut_text(d[2]) for i, d in at_line.items()}}
    return StdoutDifference(line, mode, indices[0], lines)


def cut_text(line: str | None) -> str | None:
    if line is None:
        return None
    line = visible(line) if "\r" in line else line
    return line if len(line) <= SHOWN_CHARS else line[:SHOWN_CHARS] + "…"


def recorded_mode(record: dict[str, object]) -> StdoutMode:
    """The stdout mode a run was recorded with (run.json); older runs only said `ignore_stdout`."""
    mode = record.get("stdout")
    if mode in STDOUT_MODES:
        return mode  # type: ignore[return-value]
    return "ignore" if record.get("ignore_stdout") else DEFAULT_STDOUT


def most_lenient(modes: Sequence[StdoutMode]) -> StdoutMode:
    """Of several recordings' modes, the one that compares least: whoever recorded stdout as
    meaningless (or as timing-laden) knew the script."""
    order: tuple[StdoutMode, ...] = ("ignore", "masked", "strict")
    return next((m for m in order if m in modes), DEFAULT_STDOUT)
