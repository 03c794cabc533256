"""recorder/evidence/environment.py: hash seed, environment fingerprint, thread settings, clock reads."""

from __future__ import annotations

import time
from typing import Any, get_type_hints

import pytest
import torch
from evidence_sink import Sink

from detaudit.events import CallEvent, ClockEvent, EnvironmentEvent, HashCallEvent, HashEvent
from detaudit.recorder import patch
from detaudit.recorder.evidence import environment
from detaudit.recorder.evidence.base import Evidence


def fields(cls: Any) -> set[str]:
    return set(get_type_hints(cls)) - {"at", "worker"}


def test_clock_reads_are_counted_per_user_call_site(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    perf_counter = time.perf_counter
    environment.install_clocks(ev)
    for _ in range(3):
        time.perf_counter()
    time.time()
    first, second = sink.of("clock")
    assert set(first) == fields(ClockEvent)
    assert (first["fn"], second["fn"]) == ("time.perf_counter", "time.time")
    reads = environment.clock_reads(ev)
    assert reads is not None
    assert [(s["fn"], s["reads"]) for s in reads["sites"]] == [("time.perf_counter", 3), ("time.time", 1)]
    assert reads["sites"][0]["loc"] == first["loc"]
    assert "test_evidence_environment.py:" in first["loc"]
    patch.restore_all()
    assert time.perf_counter is perf_counter


def test_no_clock_reads_no_event(evidence: tuple[Evidence, Sink]) -> None:
    ev, _ = evidence
    assert environment.clock_reads(ev) is None


def test_the_hash_event_probes_string_hashing() -> None:
    event = environment.hash_event()
    assert set(event) == fields(HashEvent)
    assert event["probe"] == hash("detaudit-hash-probe")
    assert isinstance(event["aslr_disabled"], bool)


def test_the_environment_keeps_allow_listed_variables_only(evidence: tuple[Evidence, Sink],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ev, _ = evidence
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    event = environment.environment(ev)
    assert set(event) == fields(EnvironmentEvent)
    assert event["env"]["OMP_NUM_THREADS"] == "3"
    assert "WANDB_API_KEY" not in event["env"]
    assert event["torch"] == torch.__version__
    assert event["device"] is None


def test_thread_count_settings_are_recorded_with_their_value(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    threads = torch.get_num_threads()
    environment.install_torch(ev, torch)
    try:
        torch.set_num_threads(1)
    finally:
        torch.set_num_threads(threads)
    first, second = sink.of("call")
    assert set(first) == fields(CallEvent)
    assert (first["fn"], first["value"], second["value"]) == ("torch.set_num_threads", 1, threads)


def test_reads_of_outside_values_are_recorded_once_per_user_line(evidence: tuple[Evidence, Sink]) -> None:
    import os
    import secrets
    import uuid

    from detaudit.recorder.evidence import environment

    ev, sink = evidence
    environment.install_clocks(ev)
    environment.install_secrets(ev, secrets)
    for _ in range(2):
        os.getpid()
    uuid.uuid4()  # its own os.urandom is a library call: not counted again
    secrets.token_hex(4)
    assert [e["fn"] for e in sink.of("outside")] == ["os.getpid", "uuid.uuid4", "secrets.token_hex"]
    assert all("test_evidence_environment.py" in e["loc"] for e in sink.of("outside"))


def test_hash_of_a_string_is_recorded_once_per_user_line(evidence: tuple[Evidence, Sink]) -> None:
    import builtins
    import json

    ev, sink = evidence
    environment.install_hash(ev)
    for _ in range(2):
        hash("a prompt")  # the value changes with string hash randomization
    hash(12345)  # an int's hash is its value: not recorded
    json.dumps({"k": 1})  # library code hashing nothing of the script's: not recorded
    [event] = sink.of("hash-call")
    assert set(event) == fields(HashCallEvent)
    assert event["value"] == builtins.hash("a prompt")
    assert event["of"] == "str of length 8"
    assert "test_evidence_environment.py" in event["loc"]
