"""Output causes: only what the script prints differs (docs/causes.md, docs/stdout.md).

When every recorded tensor agrees and only a stdout line differs, the line itself is the
evidence: no RNG or ordering cause is suggested unless its own evidence is there.
"""

from __future__ import annotations

import re

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, detects, finding
from detaudit.compare.stdout import comparison_key, mask_line

_TOKEN = re.compile(r"\S+")


def _changed_tokens(a: str, b: str, most: int = 3) -> list[tuple[str, str]]:
    """The first tokens that differ between two lines, position by position."""
    pairs = [(x, y) for x, y in zip(_TOKEN.findall(a), _TOKEN.findall(b)) if x != y]
    return pairs[:most]


@detects(CauseId.STDOUT_DIFFERS)
def stdout_differs(ctx: Context) -> Finding | None:
    diff = ctx.divergence.stdout
    if diff is None or ctx.divergence.category != "outcome":
        return None
    ref = diff.lines.get(diff.reference)
    index = diff.repeats[0]
    other = diff.lines[index]
    lines = [f"stdout line {diff.line}: {_quote(ref)} in repeat {diff.reference}, {_quote(other)} in repeat {index}"]
    if len(diff.repeats) > 1:
        lines.append(f"the same line differs in repeat(s) {', '.join(map(str, diff.repeats[1:]))} too")
    if diff.field is not None:
        lines.append(f"the first difference is the value of {diff.field}")
    if ref is not None and other is not None:
        changed = _changed_tokens(ref, other)
        if changed:
            lines.append("differing tokens: " + ", ".join(f"{x!r} vs {y!r}" for x, y in changed))
        if _reordered(ref, other):
            lines.append("the lines hold the same items in another order: a set (or a dict built from one) printed "
                         "in its iteration order, which for strings follows the per-run hash seed "
                         "(PYTHONHASHSEED) and for other objects their memory addresses")
        if diff.mode == "strict" and comparison_key(mask_line(ref)) == comparison_key(mask_line(other)):
            lines.append("they differ only in timings, rates, timestamps, pids or addresses: the default "
                         "`--stdout masked` compares them as equal (docs/stdout.md)")
    if ctx.divergence.index < 0:
        lines.append("every recorded tensor agrees: the training itself did not diverge")
    fix = ("if the line reports a measurement (time, speed, memory, a path, an id), it is not a result: print it "
           "to stderr or compare with `--stdout ignore`; if it is a result, it depends on something outside the "
           "recorded tensors (wall clock, pid, uuid, unseeded `random`, a file an earlier run left)")
    if ref is not None and other is not None and _reordered(ref, other):
        fix = "print `sorted(...)` of the set (or of the dict's keys) so the line's order is fixed; " + fix
    return finding("stdout-differs", 0.8, "only what the script prints differs", lines, fix, basis="direct")


def _reordered(a: str, b: str) -> bool:
    """Whether two lines hold the same words and numbers, in another order."""
    words_a, words_b = _WORD.findall(a), _WORD.findall(b)
    return words_a != words_b and sorted(words_a) == sorted(words_b)


_WORD = re.compile(r"[\w.+-]+")


def _quote(text: str | None) -> str:
    return "(output ended)" if text is None else repr(text)
