"""causes/repetition.py on hand-built draw fingerprints: what repeats across what, and what is no finding."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from detaudit.causes.context import RepeatEvidence
from detaudit.causes.repetition import MIN_VALUES, repeated_across_ranks, repeated_randomness, silenced_sites
from detaudit.events import Event


def draw(state: str | None, value: str | None = None, size: int = 16, epoch: int = 0, n: int = 0, step: int = 0,
         grad: bool = True, worker: int | None = None, **more: Any) -> Event:
    event: dict[str, Any] = {"type": "random-draw", "lib": "torch", "fn": "torch.randn", "loc": "t.py:5",
                             "site": "t.py:5", "source": "global", "state": state, "value": value, "size": size,
                             "epoch": epoch, "n": n, "step": step, "grad": grad, **more}
    if worker is not None:
        event["worker"] = worker
    return event  # type: ignore[return-value]


def evidence(main: list[Event], workers: list[Event] | None = None) -> RepeatEvidence:
    return RepeatEvidence(0, "cpu", Path("t.trace"), events=main, worker_events=workers or [])


def test_two_workers_drawing_from_one_state_repeat_across_workers() -> None:
    workers = [draw("a", worker=0, step=-1), draw("a", worker=1, step=-1)]
    assert [f.across for f in repeated_randomness(evidence([], workers))] == ["workers"]


def test_equal_states_in_two_epochs_at_the_same_draw_repeat_across_epochs() -> None:
    assert [f.across for f in repeated_randomness(evidence([draw("a", epoch=1), draw("a", epoch=2, step=4)]))] \
        == ["epochs"]


def test_equal_states_at_consecutive_steps_repeat_across_steps() -> None:
    main = [draw("a", n=0, step=0), draw("a", n=1, step=1), draw("a", n=2, step=2)]
    assert [f.across for f in repeated_randomness(evidence(main))] == ["steps"]


def test_epochs_are_named_by_their_place_not_by_a_number_a_0_based_loop_would_misread() -> None:
    """Issue 45: "(epoch 1)" named a 0-based loop's first epoch (the recorder counts DataLoader iterations from 1)."""
    [found] = repeated_randomness(evidence([draw("a", epoch=1), draw("a", epoch=2, step=4)]))
    assert found.evidence[0].startswith("the first and second epochs (the same draw of each) drew the same 16 values")


def test_a_draw_of_unknown_size_is_worded_as_values() -> None:
    """Issue 45: "drew the same its draw at" when the draw's size was not known."""
    [found] = repeated_randomness(evidence([draw("a", size=0, epoch=1), draw("a", size=0, epoch=2, step=4)]))
    assert " drew the same values at " in found.evidence[0]


def test_equal_states_every_few_steps_without_a_dataloader_repeat_across_epochs() -> None:
    main = [draw(s, n=i, step=i) for i, s in enumerate("abcabc")]
    assert [f.across for f in repeated_randomness(evidence(main))] == ["epochs"]


def test_equal_states_within_one_step_repeat_across_samples() -> None:
    assert [f.across for f in repeated_randomness(evidence([draw("a", n=0), draw("a", n=1)]))] == ["samples"]


def test_draws_under_no_grad_are_evaluation_and_not_judged() -> None:
    assert repeated_randomness(evidence([draw("a", epoch=1, grad=False), draw("a", epoch=2, grad=False)])) == []


def test_draws_while_the_models_are_in_eval_mode_are_evaluation_and_not_judged() -> None:
    main = [draw("a", epoch=1, evaluating=True), draw("a", epoch=2, evaluating=True)]
    assert repeated_randomness(evidence(main)) == []


def test_different_states_are_no_finding() -> None:
    assert repeated_randomness(evidence([draw("a", epoch=1), draw("b", epoch=2)])) == []


def test_equal_small_values_alone_may_collide_by_chance_and_are_no_finding() -> None:
    main = [draw(None, "v", size=1, n=0), draw(None, "v", size=1, n=1), draw(None, "v", size=1, n=2)]
    assert repeated_randomness(evidence(main)) == []


def test_equal_large_values_seen_twice_are_circumstantial_evidence() -> None:
    main = [draw(None, "v", size=MIN_VALUES, n=0), draw(None, "v", size=MIN_VALUES, n=1),
            draw(None, "v", size=MIN_VALUES, n=2)]
    assert "equal values alone" in repeated_randomness(evidence(main))[0].evidence[0]


def test_the_seeding_before_the_draw_is_where_the_state_was_made() -> None:
    seed: Event = {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "t.py:3",
                   "library": False, "drawn_before": False, "state": "a", "pinned": None, "at": 0}
    found = repeated_randomness(evidence([seed, draw("a", epoch=1, at=1), draw("a", epoch=2, at=5)]))
    assert found[0].created_at == "t.py:3"


def test_a_silenced_site_is_not_reported() -> None:
    main = [draw("a", epoch=1), draw("a", epoch=2)]
    assert repeated_randomness(evidence(main), silenced_sites({"DETAUDIT_REPEATS_OK": "other.py:1, t.py:5"})) == []


def test_a_worker_seeded_alike_every_epoch_is_told_to_seed_from_torchs_worker_seed() -> None:
    seed: Event = {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "t.py:9",
                   "library": False, "drawn_before": False, "state": "a", "pinned": None, "worker": 0}
    workers = [seed, draw("a", epoch=1, step=-1, worker=0), seed, draw("a", epoch=2, step=-1, worker=0)]
    [found] = repeated_randomness(evidence([], workers))
    assert (found.across, found.created_at) == ("epochs", "t.py:9")
    assert "torch.initial_seed()" in found.fix


def test_two_generators_the_script_made_alike_repeat_by_design_and_are_not_judged() -> None:
    main = [draw("a", epoch=1, source="object", obj=3), draw("a", epoch=2, source="object", obj=4)]
    assert repeated_randomness(evidence(main)) == []


def rank(index: int, main: list[Event], workers: list[Event]) -> RepeatEvidence:
    return RepeatEvidence(0, "cpu", Path(f"rank-{index}.trace"), events=main, worker_events=workers)


def test_ranks_whose_workers_draw_from_equal_states_repeat_across_ranks() -> None:
    """Every rank seeded alike: torch seeds each rank's workers alike, so the ranks augment alike."""
    seed = cast(Event, {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "t.py:2",
                        "library": False, "drawn_before": False, "state": "s"})
    ranks = [rank(r, [seed], [draw("a", worker=0, step=-1, rank=r), draw("b", worker=0, n=1, step=-1, rank=r)])
             for r in (0, 1)]
    [found] = repeated_across_ranks(ranks)
    assert (found.across, found.site, found.created_at) == ("ranks", "t.py:5", "t.py:2")
    assert found.evidence[1] == ("torch's global RNG was seeded by `torch.manual_seed(0)` at t.py:2 in the main "
                                 "process, which seeds each DataLoader worker from it")
    assert found.evidence[0].startswith("ranks 0 and 1 (DataLoader worker 0 of each, before any DataLoader epoch) "
                                        "drew the same 16 values at t.py:5")
    assert "torch seeds each DataLoader worker from its rank's own RNG" in found.fix


def test_main_process_draws_alike_on_every_rank_are_no_finding() -> None:
    """A model initialised alike (what DDP needs) and dropout seeded alike are the usual data-parallel setup."""
    ranks = [rank(r, [draw("a", step=-1, rank=r), draw("b", n=1, rank=r)], []) for r in (0, 1)]
    assert repeated_across_ranks(ranks) == []


def test_ranks_whose_workers_draw_differently_and_silenced_sites_are_no_finding() -> None:
    ranks = [rank(r, [], [draw(f"state-{r}", worker=0, step=-1, rank=r)]) for r in (0, 1)]
    assert repeated_across_ranks(ranks) == []
    alike = [rank(r, [], [draw("a", worker=0, step=-1, rank=r)]) for r in (0, 1)]
    assert repeated_across_ranks(alike, silenced=["t.py:5"]) == []


def test_a_generator_recreated_alike_at_each_training_step_repeats_across_steps() -> None:
    """A noise helper building `torch.Generator().manual_seed(42)` at every call adds the same noise every step."""
    made = [cast(Event, {"type": "generator", "lib": "torch", "fn": "Generator.manual_seed", "seeded": True,
                         "value": 42, "loc": "t.py:6", "library": False, "state": "g", "obj": i}) for i in range(3)]
    main = [e for i in range(3) for e in (made[i], draw("g", n=i, step=i, source="object", obj=i))]
    [found] = repeated_randomness(evidence(main))
    assert (found.across, found.created_at) == ("steps", "t.py:6")
    assert found.fix.startswith("make the generator once, before the training loop, instead of at every call at "
                                "t.py:6")


def test_generators_made_alike_for_fixed_buffers_at_setup_or_in_evaluation_are_not_judged() -> None:
    setup = [draw("a", n=0, step=0, source="object", obj=1), draw("a", n=1, step=0, source="object", obj=2)]
    evaluation = [draw("b", n=i, step=i, source="object", obj=3 + i, grad=False) for i in range(2)]
    assert repeated_randomness(evidence(setup + evaluation)) == []
