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
from typing import Union, cast, get_args

from detaudit.records import RunRecord
from detaudit.results import StdoutDifference, StdoutMode

STDOUT_MODES: tuple[str, ...] = get_args(StdoutMode)
DEFAULT_STDOUT: StdoutMode = "masked"
SHOWN_CHARS = 240  # a line shown in a report is cut to this many characters

_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"  # 1,234.5 too
_CLOCK = r"(?<!\d)\d{1,6}:\d{2}(?::\d{2})?(?:\.\d+)?"
# words whose value is a time or a speed whatever its unit (`step_time 3.2`, `mfu 41.2%`, `eta 0:12`): also as
# frameworks abbreviate them (cleanrl's `SPS`, Stable-Baselines3's `fps` and `time_elapsed`, torchtitan's `tps` and
# `tflops`, fairseq's `wps`, `ups` and `train_wall`, Ray's `time_this_iter_s`) and `…_per_s(ec)`, `…PerSec`
_WORDS = (r"(?:(?:(?:time|runtime|walltime|wall|elapsed|eta|mfu|fps|sps|tps|wps|ups|tflops|throughput|duration|took"
          r"|latency)(?:_(?:elapsed|total|this_iter|since_restore|s|secs?|ms|seconds?))*(?:[ _](?:taken|spent))?"
          r"|[A-Za-z_]{0,40}?(?:(?<![A-Za-z])per_|_per_|(?-i:Per))s(?:ec(?:ond)?)?"
          r"|[A-Za-z][A-Za-z_]{0,40}?_(?:ms|us|secs|seconds))"
          # per what or whom (`time/step`, `tokens_per_sec_per_gpu`)
          r"(?:(?:_per_|/)[A-Za-z]{1,20})?)")
# a memory figure (`mem 1234MB`, `max_memory_allocated: 1234.5`, torchtitan's `memory: 4.23GiB(5.33%)`): the
# allocator's and the process's footprint follow caching and timing, not the results
_MEMORY_WORD = r"(?:[A-Za-z]{1,12}_){0,2}mem(?:ory)?(?:_(?:allocated|reserved|used|usage|peak|rss|[kmg]i?b))*"
_BYTES = r"(?:[KMGT]i?B|bytes)"
_RATE = r"(?:[A-Za-z]+/s(?:ec)?|(?:m?s|sec)/[A-Za-z]+)"
# units of time, and rates "something per second" / "seconds per something"
_PLAIN = r"(?:ms|us|µs|ns|s|sec|secs|seconds?|mins?|minutes?|hrs?|hours?)"
_UNIT = r"(?:" + _RATE + r"|/s(?:ec)?|" + _PLAIN + ")"  # a rate first: `ms/step` is one unit; timm's bare `103.7/s`
# units that also serve as a column label before their value (`ms=12`); not `min`/`s`: `min: -0.01` is a result
_LABEL = r"(?:ms|us|µs|ns|secs?|seconds)"
# after a spaced rate, what makes it the label of the number that follows instead of the suffix of the one
# before (`acc 0.91 sec/it 0.5`): a `:`/`=`, or a number with no unit of its own (`#`: one a header rule masked).
# A plain time unit labels the next number only with `:`/`=` (`loss=0.51 ms=12`; `41.2 ms 0.5123` is a suffix)
_RATE_LABELS_NEXT = rf"(?=\s*[:=]|\s+#|\s+{_NUM}(?!\s?{_UNIT}(?![\w/]))(?![\w.,]))"

# a meter's running average in parentheses after its value (`0.123 ( 0.456)`, `1.234s (1.302s)`)
_MEAN = rf"(?P<mean>\s*\(\s*{_NUM}\s?(?:%|{_UNIT})?\s*\))"
_NUM_RE = re.compile(_NUM)


def _averaged(m: re.Match[str]) -> str:
    """The running average of a masked measurement, masked too."""
    return _NUM_RE.sub("#", m.group("mean") or "", count=1)


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
    # a timing word, then its value: a clock, or a number with or without a unit or %; the word may head a table's
    # row (`|    fps    | 1234 |`), and the value may have its running average beside it (`Time  0.123 ( 0.456)`)
    (re.compile(rf"(?i)((?<![A-Za-z]){_WORDS}(?![A-Za-z])(?:\s+per\s+[A-Za-z_]{{1,20}})?['\"]?\s*"
                rf"(?:\([^)]{{0,20}}\))?\s*[:=|│]?\s*['\"]?\s*)"
                rf"(?:{_CLOCK}|{_NUM})(\s?(?:%|{_UNIT})(?!\w))?{_MEAN}?"),
     lambda m: m.group(1) + "#" + (m.group(2) or "") + _averaged(m)),
    # a memory figure keyed by its name, with its unit and share in parentheses, and any number with a byte unit
    (re.compile(rf"(?i)((?<![A-Za-z]){_MEMORY_WORD}(?![A-Za-z])['\"]?\s*[:=|]?\s*){_NUM}(\s?{_BYTES})?"
                rf"(?:\(\s*{_NUM}\s?%\s*\))?"),
     lambda m: m.group(1) + "#" + (m.group(2) or "") + ("(#%)" if m.group(0).rstrip().endswith("%)") else "")),
    (re.compile(rf"(?<![\w.#]){_NUM}(\s?(?-i:[KMGT]i?B))(?![\w/])"), r"#\1"),
    # a data-loading time as torchvision's and timm's meters print it: `Data  0.012 ( 0.034)`, always with its average
    (re.compile(rf"(?i)((?<![A-Za-z])data['\"]?\s*[:=]?\s*){_NUM}{_MEAN}"),
     lambda m: m.group(1) + "#" + _averaged(m)),
    # a rate as a column header before its value (`tok/s: 1234`, `sec/it 0.5`), a time unit as one (`ms=12`); a
    # value with a unit of its own is not the header's (`1200 tokens/s 3.1 samples/s`)
    (re.compile(rf"((?<![A-Za-z])(?:{_RATE}(?![A-Za-z])\s*[:=]?|(?<![\w.]){_LABEL}(?![A-Za-z/])\s*[:=])\s*)"
                rf"{_NUM}(?!\s?{_UNIT}(?![\w/]))(?![\w.,])"), r"\1#"),
    # a number with a time or rate unit (`14.20ms`, `0.82 s`, `19.5it/s`, `1200 tokens/s`) — spaced, only where the
    # unit is not the label of what follows — and tqdm's `?it/s`
    (re.compile(rf"(?<![\w.#]){_NUM}({_UNIT})(?![\w/])"), r"#\1"),
    (re.compile(rf"(?<![\w.#]){_NUM}(\s{{1,16}}{_RATE})(?![\w/])(?!{_RATE_LABELS_NEXT})"), r"#\1"),
    (re.compile(rf"(?<![\w.#]){_NUM}(\s{{1,16}}{_PLAIN})(?![\w/])(?!\s*[:=])"), r"#\1"),
    (re.compile(r"\?(?=\s?(?:it/s|s/it)\b)"), "#"),
)


# progress bars: tqdm's `NN%|bar|` (the bar's width can follow the terminal and the other fields), rich's and
# keras' `━━━╸` and block-character runs; the percentage and the `n/total` beside them are still compared
# (tqdm's: full cells, one partial cell, blanks; `ascii=True` draws `#` and a digit)
_BAR = re.compile(r"(?<=%\|)(?=[^|])[#█]{0,400}[1-9▏▎▍▌▋▊▉]?[ ]{0,400}(?=\|)|[━╸╺█▏▎▍▌▋▊▉▐░▒▓]+")
# a value in a table column of measurements: a number or clock (fastai's `00:03`), quoted or with its unit
_MEASURE = re.compile(rf"^\s*['\"]?(?:{_CLOCK}|\d{{1,2}}:\d{{2}}|{_NUM})['\"]?\s?(?:%|{_UNIT})?\s*$")
_PLACEHOLDER = r"(?:#|<timestamp>|<elapsed>|<clock>|<bar>)"
_AROUND = re.compile(rf"[ \t]*({_PLACEHOLDER})[ \t]*")  # padding is spaces (and tabs)
_RULE_RUN = re.compile(r"([-=─━═_~])\1{2,}")  # a table's horizontal rule: its length follows the column widths
_SPACES = re.compile(r"[ \t]+")
# column separators of a table (`|`, rich's `│` rows and `┃` header)
_SEPARATOR = re.compile(r"[|│┃║]")
_TIMING_HEADER = re.compile(rf"(?i)(?:(?<![A-Za-z]){_WORDS}(?![A-Za-z])|^\s*(?:{_RATE}|{_PLAIN})\s*$"
                            rf"|[(\[]\s*(?:{_PLAIN}|{_RATE})\s*[)\]])")
# the name a value stands under in a line: `key: `, `'key': '`, `"key": `, `key=`, `key `
_KEY_BEFORE = re.compile(r"([A-Za-z_][\w./-]{0,60})['\"]?(?:\s*[:=]\s*['\"]?\s*|\s+)$")
# a key in a table's row of its own, beside its value (Stable-Baselines3's `|    ep_rew_mean  | -120 |`)
_ROW_KEY = re.compile(r"([A-Za-z_][\w./-]{0,60})\s*[|│]\s*$")
_NUMBER = re.compile(rf"(?<![\w.]){_NUM}(?!\w)")  # a number standing alone: a row's, not a header's


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


def comparison_key(masked: str) -> str:
    """What of a masked line is compared: its tokens, not how they are padded.

    A masked value's width (`1.00s` / `10.00s`, a rate's digits) moves the padding around it, a
    column's width, a progress bar's length and a table rule's length: none of these count. How much
    whitespace separates two tokens does not count either, whether any does still counts (`1 2` is
    not `12`), except next to a placeholder.
    """
    text = _BAR.sub("<bar>", masked)
    text = _RULE_RUN.sub(r"\1\1\1", text)
    text = _AROUND.sub(r"\1", text)
    return _SPACES.sub(" ", text).strip(" \t")


@dataclass(frozen=True)
class _Header:
    """A table's header line: where its columns are and which of them hold measurements."""

    piped: bool
    spans: tuple[tuple[int, int], ...]  # whitespace tables: each column's [start, end) in the header
    names: tuple[str, ...]
    timing: tuple[bool, ...]


def _fields(text: str) -> tuple[bool, list[tuple[int, int]]]:
    """A line's fields: between column separators when it has them, else its whitespace-separated tokens."""
    if _SEPARATOR.search(text):
        bounds = [-1, *(m.start() for m in _SEPARATOR.finditer(text)), len(text)]
        spans = [(a + 1, b) for a, b in zip(bounds, bounds[1:])]
        return True, [(a, b) for a, b in spans if text[a:b].strip() or 0 < a <= b < len(text)]
    return False, [m.span() for m in re.finditer(r"\S+", text)]


def _header(text: str) -> _Header | None:
    """The line as a table header: two or more named columns, no numbers, one of them a measurement."""
    piped, spans = _fields(text)
    names = tuple(text[a:b].strip() for a, b in spans)
    if not piped and any(start - end < 2 for (_, end), (start, _) in zip(spans, spans[1:])):
        return None  # a whitespace table pads its columns: single spaces are prose (`epoch time: total`)
    if len(names) < 2 or any(n and not re.search(r"[A-Za-z]", n) for n in names) \
            or any(_NUMBER.search(n) for n in names):
        return None
    timing = tuple(bool(n) and _TIMING_HEADER.search(n) is not None for n in names)
    return _Header(piped, tuple(spans), names, timing) if any(timing) else None


class Masker:
    """Masks one output's lines in order: a table's header names the columns whose values are
    measurements (`time`, `epoch_time (s)`, `it/s`), so those values are masked in the rows below it."""

    def __init__(self) -> None:
        self.header: _Header | None = None

    def mask(self, line: str) -> str:
        text = _RULES[0][0].sub("", visible(line))  # escapes first: columns are found on what is shown
        header = _header(text)
        if header is not None:
            self.header = header
        elif self.header is not None:
            text = self._mask_columns(text, self.header)
        return mask_line(text)

    def column(self, line: str, position: int) -> str | None:
        """The header name of the column at `position` of a (masked) row, when a header applies."""
        columns = self._columns(line, self.header) if self.header is not None else None
        return next((name for (a, b), name, _ in columns or () if a <= position <= b and name), None)

    @staticmethod
    def _columns(text: str, header: _Header) -> list[tuple[tuple[int, int], str, bool]] | None:
        """Each field of a row with its column's name and whether it holds measurements; None when the
        line is no row of this table. A whitespace table's row may lead with an unnamed index (pandas)."""
        piped, spans = _fields(text)
        names, timing, head = list(header.names), list(header.timing), list(header.spans)
        if not piped and len(spans) == len(names) + 1 and header.spans[0][0] > 0:
            names, timing, head = ["", *names], [False, *timing], [(0, 0), *head]
        if piped != header.piped or len(spans) != len(names):
            return None
        if not piped:  # aligned: each field lies under its own header column
            for i, (a, b) in enumerate(spans):
                lo = head[i - 1][1] if i else 0
                hi = head[i + 1][0] if i + 1 < len(spans) else len(text) + 1
                if b <= lo or a >= hi:
                    return None
        return list(zip(spans, names, timing))

    @classmethod
    def _mask_columns(cls, text: str, header: _Header) -> str:
        columns = cls._columns(text, header)
        if columns is None:
            return text
        out, last = [], 0
        for (a, b), _, timing in columns:
            if timing and _MEASURE.match(text[a:b]):
                out.append(text[last:a] + "#")
                last = b
        return "".join(out) + text[last:]


def _lines(path: Path) -> Iterator[bytes]:
    """A file's lines as bytes, split on `\\n` only (a `\\r` progress update stays inside its line)."""
    from detaudit.trace import open_regular

    # a file of a run directory: regular, never followed through a symlink planted there
    with open_regular(path, "stdout capture") as fh:
        for raw in fh:
            yield raw.rstrip(b"\n")


def _text(raw: bytes) -> str:
    """A line as text for masking, losslessly: invalid UTF-8 bytes become distinct surrogates, so
    lines whose bytes differ never mask alike."""
    return raw.decode("utf-8", errors="surrogateescape")


def shown(raw: bytes | None) -> str | None:
    """A line as a report shows it: invalid UTF-8 as `\\x..` escapes (never one replacement character
    for every byte, which would show two different lines as the same)."""
    return None if raw is None else raw.decode("utf-8", errors="backslashreplace")


@dataclass(frozen=True)
class _Found:
    line: int
    reference: bytes | None
    other: bytes | None
    field: str | None


def _differences(reference: Path, other: Path, mode: StdoutMode) -> Iterator[_Found]:
    """Every line that differs under `mode`, in order (line by line: a line one output lacks is None there)."""
    ref_lines, other_lines = _lines(reference), _lines(other)
    ref_mask, other_mask = Masker(), Masker()
    number = 0
    while True:
        number += 1
        a, b = next(ref_lines, None), next(other_lines, None)
        if a is None and b is None:
            return
        if mode == "strict" or a is None or b is None:
            if a != b:
                yield _Found(number, a, b, None)
            continue
        # every line goes through its file's masker, equal or not: a table header must be seen
        key_a, key_b = comparison_key(ref_mask.mask(_text(a))), comparison_key(other_mask.mask(_text(b)))
        if a != b and key_a != key_b:
            yield _Found(number, a, b, differing_field(_text(a), _text(b), ref_mask))


def _first_difference(reference: Path, other: Path, mode: StdoutMode) -> _Found | None:
    return next(_differences(reference, other, mode), None)


def steady_difference(references: Sequence[Path], other: Path,
                      mode: StdoutMode) -> tuple[StdoutDifference | None, list[int]]:
    """`other`'s first line that differs from the first reference's where every reference prints it alike (under
    `mode`), and the lines the references themselves print otherwise (a number their own variation moves: no
    evidence either way, so `other`'s difference there is not counted). The difference names the first reference
    as repeat 0, `other` as repeat 1."""
    if mode == "ignore" or not references:
        return None, []
    noisy = sorted({d.line for path in references[1:] for d in _differences(references[0], path, mode)})
    unsteady = set(noisy)
    found = next((d for d in _differences(references[0], other, mode) if d.line not in unsteady), None)
    if found is None:
        return None, noisy
    return StdoutDifference(found.line, mode, 0, {0: cut_text(shown(found.reference)),
                                                  1: cut_text(shown(found.other))}, found.field), noisy


def first_difference(reference: Path, other: Path, mode: StdoutMode) -> tuple[int, str | None, str | None] | None:
    """(line number, reference's line, other's line) of the first line that differs under `mode`:
    byte for byte under `strict`, by `comparison_key` of the masked lines under `masked`."""
    found = _first_difference(reference, other, mode)
    return None if found is None else (found.line, shown(found.reference), shown(found.other))


def differing_field(a: str, b: str, masker: Masker | None = None) -> str | None:
    """The key (`'v_num'`, `train_loss`) or table column the first differing token of two lines stands
    under, or None when the line names none."""
    ma, mb = (_RULE_RUN.sub(r"\1\1\1", _BAR.sub("<bar>", mask_line(x))) for x in (a, b))
    ta, tb = re.findall(r"\S+", ma), re.findall(r"\S+", mb)
    spans = [m.span() for m in re.finditer(r"\S+", ma)]
    diff = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    if diff is None:
        return None
    start, end = spans[diff]
    token = ma[start:end]
    # the key may be the token's own head (`v_num=0` vs `v_num=1`, `'loss':`)
    inner = re.match(r"['\"]?([A-Za-z_][\w./-]{0,60})['\"]?[:=]", token)
    if inner is not None and ta[diff].split(inner.group(0)[-1])[0] == tb[diff].split(inner.group(0)[-1])[0]:
        return inner.group(1)
    before = _KEY_BEFORE.search(ma[:start])
    if before is not None:
        return before.group(1)
    column = masker.column(ma, start) if masker is not None else None
    if column:
        return f"column {column}"
    row = _ROW_KEY.search(ma[:start])
    return row.group(1) if row is not None else None


def compare_stdout(paths: Sequence[Path], indices: Sequence[int], mode: StdoutMode) -> StdoutDifference | None:
    """Compare each repeat's stdout file with the first one's; the earliest differing line, or None.

    `indices` are the repeats the paths belong to. Every repeat that differs on that same line is
    listed; the others may differ later.
    """
    if mode == "ignore" or len(paths) < 2:
        return None
    found: dict[int, _Found] = {}
    for path, index in zip(paths[1:], indices[1:]):
        diff = _first_difference(paths[0], path, mode)
        if diff is not None:
            found[index] = diff
    if not found:
        return None
    line = min(d.line for d in found.values())
    at_line = {i: d for i, d in found.items() if d.line == line}
    first = next(iter(at_line.values()))
    lines = {indices[0]: cut_text(shown(first.reference)), **{i: cut_text(shown(d.other)) for i, d in at_line.items()}}
    return StdoutDifference(line, mode, indices[0], lines, first.field)


def cut_text(line: str | None) -> str | None:
    if line is None:
        return None
    line = visible(line) if "\r" in line else line
    return line if len(line) <= SHOWN_CHARS else line[:SHOWN_CHARS] + "…"


def recorded_mode(record: RunRecord) -> StdoutMode:
    """The stdout mode a run was recorded with (run.json); older runs only said `ignore_stdout`."""
    mode = record.stdout
    if mode in STDOUT_MODES:
        return cast(StdoutMode, mode)
    return "ignore" if record.ignore_stdout else DEFAULT_STDOUT


def most_lenient(modes: Sequence[StdoutMode]) -> StdoutMode:
    """Of several recordings' modes, the one that compares least: whoever recorded stdout as
    meaningless (or as timing-laden) knew the script."""
    order: tuple[StdoutMode, ...] = ("ignore", "masked", "strict")
    return next((m for m in order if m in modes), DEFAULT_STDOUT)
