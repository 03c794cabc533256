"""The trace file: a versioned, streaming, pickle-free record of one repeat.

Layout (docs/trace-format.md): an 8-byte magic, then frames of `tag (1 byte) | length (u32 LE) |
payload`. Tags: H header (JSON), S new strings (JSON list, appended to the string table),
R records (packed `RECORD_DTYPE` rows), E evidence event (JSON), F footer (JSON). Frames are
appended whole on an unbuffered descriptor, so a repeat killed at any moment leaves a readable
prefix (a frame cut short is ignored); a missing footer marks the trace incomplete.

format.py holds what both sides share, writer.py the child's side, reader.py the readers'; import
from `detaudit.trace`.
"""

from detaudit.trace.format import (
    FORMAT_VERSION,
    LOADER_BATCH,
    MAGIC,
    N_SAMPLES,
    RECORD_DTYPE,
    Flag,
    Kind,
    Record,
)
from detaudit.trace.reader import (
    EmptyTrace,
    GrowingTrace,
    RecordStream,
    Trace,
    load_json,
    open_regular,
    read_events,
    read_footer,
    read_regular,
    read_trace,
    sha256_regular,
)
from detaudit.trace.writer import FLUSH_EVERY, TraceWriter

__all__ = [
    "FLUSH_EVERY", "FORMAT_VERSION", "LOADER_BATCH", "MAGIC", "N_SAMPLES", "RECORD_DTYPE", "EmptyTrace", "Flag",
    "GrowingTrace", "Kind", "Record", "RecordStream", "Trace", "TraceWriter", "load_json", "open_regular",
    "read_events", "read_footer", "read_regular", "read_trace", "sha256_regular",
]
