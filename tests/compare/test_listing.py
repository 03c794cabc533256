"""compare/listing.py: a trace read as `detaudit show` lists it."""

from __future__ import annotations

from pathlib import Path

from synthetic import training_records, write_trace

from detaudit.compare.listing import TraceListing


def test_every_record_is_listed_in_order(tmp_path: Path) -> None:
    recs = training_records()
    listing = TraceListing(write_trace(tmp_path / "t.trace", recs, {"exit_code": 0}))
    assert [r.index for r in listing.records()] == list(range(len(recs)))


def test_a_record_is_named_in_words(tmp_path: Path) -> None:
    listing = TraceListing(write_trace(tmp_path / "t.trace", training_records(), {"exit_code": 0}))
    first = next(listing.records())
    assert (first.name, first.tensor, first.location) == ("net.0", "float32[4]", "train.py:10")


def test_the_digest_is_sixteen_hex_digits(tmp_path: Path) -> None:
    listing = TraceListing(write_trace(tmp_path / "t.trace", training_records(), {"exit_code": 0}))
    assert next(listing.records()).digest == f"{1000:016x}"


def test_the_footer_is_read_after_the_records(tmp_path: Path) -> None:
    listing = TraceListing(write_trace(tmp_path / "t.trace", training_records(), {"exit_code": 0}))
    list(listing.records())
    assert listing.footer is not None


def test_a_trace_without_a_footer_says_its_repeat_died(tmp_path: Path) -> None:
    listing = TraceListing(write_trace(tmp_path / "t.trace", training_records(), None))
    list(listing.records())
    assert listing.why_no_footer() == "(the repeat was killed or crashed hard)"
