"""The part of a failed repeat's stderr worth showing: the user's own frames and the error."""

from __future__ import annotations

import os

_LIBRARY_MARKERS = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python")
# the recorder's wrappers around the user's calls: never the frame that explains an error
_RECORDER = f"{os.sep}detaudit{os.sep}recorder{os.sep}"


def error_excerpt(stderr: str, lines: int = 15) -> str:
    """The end of a repeat's stderr; for a long traceback, the user's own frames and the error.

    Library frames (torch's, most often) crowd the user's line out of a plain tail.
    """
    all_lines = stderr.rstrip().splitlines()
    starts = [i for i, line in enumerate(all_lines) if line.startswith("Traceback (most recent call last)")]
    if not starts or len(all_lines) - starts[-1] <= lines:
        return "\n".join(all_lines[-lines:])
    block = all_lines[starts[-1]:]
    frames = [i for i, line in enumerate(block) if line.startswith('  File "')]
    if not frames:  # no frame lines (a chained or hand-written "traceback"): the plain tail
        return "\n".join(all_lines[-lines:])
    end_of_frames = frames[-1] + 1
    while end_of_frames < len(block) and block[end_of_frames].startswith("    "):
        end_of_frames += 1
    kept = [block[0]]
    frames = [i for i in frames if _RECORDER not in block[i]] or frames
    for n, start in enumerate(frames):
        stop = next((i for i in range(start + 1, end_of_frames) if block[i].startswith('  File "')), end_of_frames)
        if n == len(frames) - 1 or not any(m in block[start] for m in _LIBRARY_MARKERS):
            kept.extend(block[start:stop])
        elif kept[-1] != "  ...":
            kept.append("  ...")
    return "\n".join(kept + block[end_of_frames:])

