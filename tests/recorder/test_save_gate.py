"""A torch.save's wait for the watching parent's checks (recorder/save_gate.py), on a fake clock."""

from __future__ import annotations

import json
from pathlib import Path

from detaudit.recorder.save_gate import Gate, await_check, read_handshake


class FakeClock:
    """Seconds that pass only when the wait sleeps; `on_sleep` may change the world meanwhile."""

    def __init__(self, on_sleep: list[str] | None = None, path: Path | None = None) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.writes = list(on_sleep or [])
        self.path = path

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.writes and self.path is not None:
            self.path.write_text(self.writes.pop(0))


def _told(checked_to: int, mismatch_at: int | None = None) -> str:
    return json.dumps({"checked_to": checked_to, "mismatch_at": mismatch_at})


def test_a_save_the_parent_has_checked_up_to_goes_ahead_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "watch-checked.json"
    path.write_text(_told(4))
    clock = FakeClock()
    assert await_check(str(path), 4, 60.0, clock, clock.sleep) is Gate.CHECKED
    assert clock.sleeps == 0


def test_a_save_waits_until_the_parent_has_compared_the_step_that_ended(tmp_path: Path) -> None:
    path = tmp_path / "watch-checked.json"
    path.write_text(_told(2))
    clock = FakeClock([_told(2), _told(3)], path)
    assert await_check(str(path), 3, 60.0, clock, clock.sleep) is Gate.CHECKED
    assert clock.sleeps == 2


def test_a_mismatch_the_parent_finds_while_a_save_waits_ends_the_wait(tmp_path: Path) -> None:
    path = tmp_path / "watch-checked.json"
    clock = FakeClock([_told(1), _told(1, 2)], path)
    assert await_check(str(path), 2, 60.0, clock, clock.sleep) is Gate.MISMATCH


def test_a_parent_that_never_catches_up_lets_the_save_go_ahead_after_the_patience(tmp_path: Path) -> None:
    path = tmp_path / "watch-checked.json"
    clock = FakeClock()
    assert await_check(str(path), 0, 1.0, clock, clock.sleep) is Gate.TIMED_OUT
    assert clock.now >= 1.0


def test_a_file_that_is_not_the_parents_handshake_reads_as_absent(tmp_path: Path) -> None:
    path = tmp_path / "watch-checked.json"
    path.write_text('{"checked_to": "soon"}')
    assert read_handshake(str(path)) is None
