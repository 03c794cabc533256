"""Masking what scripts print: timings and other volatile tokens go, results stay (docs/stdout.md)."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detaudit.compare.stdout import (
    Masker,
    compare_stdout,
    comparison_key,
    first_difference,
    mask_line,
    most_lenient,
    recorded_mode,
    visible,
)
from detaudit.records import RunRecord

# lines real training scripts print, with what must be left of them
MASKED = [
    ("iter 100: loss 2.1234, time 14.20ms, mfu 12.34%", "iter 100: loss 2.1234, time #ms, mfu #%"),
    ("time: 0.82s", "time: #s"),
    ("epoch 3 took 12.3 s", "epoch 3 took # s"),
    ("step 10 | loss 0.5000 | 13.63 ms/batch", "step 10 | loss 0.5000 | # ms/batch"),
    (" 50%|█████     | 50/100 [00:01<00:02, 19.50it/s]", " 50%|█████     | 50/100 [<elapsed>, #it/s]"),
    ("100%|██████████| 100/100 [00:02<00:00, 45.31it/s]", "100%|██████████| 100/100 [<elapsed>, #it/s]"),
    ("  0%|          | 0/100 [00:00<?, ?it/s]", "  0%|          | 0/100 [<elapsed>, #it/s]"),
    ("train: 3.2s/it", "train: #s/it"),
    ("1200 tokens/s 3.1 samples/s 45 tok/s", "# tokens/s # samples/s # tok/s"),
    ("tok/sec: 123456.7 | loss 3.21", "tok/sec: # | loss 3.21"),
    ("2026-11-22 23:58:05,123 INFO epoch 1 acc 93.5%", "<timestamp> INFO epoch 1 acc 93.5%"),
    ("[2026-11-22T23:58:05.123456+00:00] done", "[<timestamp>] done"),
    ("started 23:58:05, eta 0:00:12", "started <clock>, eta <clock>"),
    ("step_time=0.034 data_time 0.001 loss=0.25", "step_time=# data_time # loss=0.25"),
    ("throughput: 1234.5 samples/s", "throughput: # samples/s"),
    ("Elapsed (s): 3.25", "Elapsed (s): #"),
    ("<__main__.Net object at 0x7f3a1c2b9d50> pid 4242", "<__main__.Net object at 0x#> pid #"),
    ("worker PID=31337 ready", "worker PID=# ready"),
    ("{'train_runtime': 12.3, 'train_samples_per_second': 45.6, 'loss': 0.25}",
     "{'train_runtime': #, 'train_samples_per_second': #, 'loss': 0.25}"),
    ("Epoch 3/10 - loss: 0.4321 - accuracy: 0.8765 - 2s 12ms/step",
     "Epoch 3/10 - loss: 0.4321 - accuracy: 0.8765 - #s #ms/step"),
    ("\x1b[32mok\x1b[0m latency 3.2ms", "ok latency #ms"),
    # a timing label before its value leaves the metric before it alone (a probe found these masked)
    ("val_acc: 0.8870 ms/step: 0.5", "val_acc: 0.8870 ms/step: #"),
    ("acc 0.91 sec/it 0.5", "acc 0.91 sec/it #"),
    ("loss=0.5123 ms=12", "loss=0.5123 ms=#"),
    ("elapsed=1m02s eta 1h2m3s", "elapsed=# eta #"),
    ("time per batch 0.012", "time per batch #"),
    ("1,234 tokens/s", "# tokens/s"),
    # a plain time unit is the suffix of the number before it unless `:`/`=` makes it a header (a review
    # found these unmasked: deterministic scripts printing `{dt:.1f} ms {loss:.4f}` diverged)
    ("step 3 41.2 ms 0.5123", "step 3 # ms 0.5123"),
    ("epoch 1 | 3.20 s 0.51", "epoch 1 | # s 0.51"),
    ("loss 0.51,12.3ms", "loss 0.51,#ms"),
    # as real frameworks spell their rates and times (issue 44): cleanrl, Stable-Baselines3's table, torchvision's
    # and timm's meters (a running average beside the value, a bare `/s`), fairseq, torchtitan, Ray, DeepSpeed
    ("SPS: 82", "SPS: #"),
    ("|    fps             | 1234     |", "|    fps             | #     |"),
    ("|    time_elapsed    | 12       |", "|    time_elapsed    | #       |"),
    ("Epoch: [0][ 10/500]\tTime  0.123 ( 0.456)\tData  0.012 ( 0.034)\tLoss 6.9e+00 (6.9e+00)",
     "Epoch: [0][ 10/500]\tTime  # ( #)\tData  # ( #)\tLoss 6.9e+00 (6.9e+00)"),
    ("Loss: 6.9 (6.9)  Time: 1.234s,  103.7/s  (1.234s,  103.7/s)  Data: 0.123 (0.123)",
     "Loss: 6.9 (6.9)  Time: #s,  #/s  (#s,  #/s)  Data: # (#)"),
    ("loss 4.5 | ppl 22 | wps 12345.6 | ups 3.2 | wpb 3800 | train_wall 30 | wall 35",
     "loss 4.5 | ppl 22 | wps # | ups # | wpb 3800 | train_wall # | wall #"),
    ("step:  1  loss: 10.8  tps: 1,234  tflops: 12.3  mfu: 4.5%", "step:  1  loss: 10.8  tps: #  tflops: #  mfu: #%"),
    ("time_this_iter_s: 12.3 time_total_s: 45.6 time_since_restore: 45.6",
     "time_this_iter_s: # time_total_s: # time_since_restore: #"),
    ("SamplesPerSec=123.45 tokens_per_s: 99", "SamplesPerSec=# tokens_per_s: #"),
    ("step 0 | loss: 10.9 | norm: 15.4 | dt: 1234.56ms | tok/sec: 12345.67",
     "step 0 | loss: 10.9 | norm: 15.4 | dt: #ms | tok/sec: #"),
    # per device, per step, `taken`, a unit as a name's suffix (a new user's trial found these unmasked)
    ("tokens_per_sec_per_gpu: 1234.5 tokens/sec/gpu 99", "tokens_per_sec_per_gpu: # tokens/sec/gpu #"),
    ("Time taken: 12.3", "Time taken: #"),
    ("time/step=0.123 loss=1.2", "time/step=# loss=1.2"),
    ("step_ms=45.2 loss=1.2", "step_ms=# loss=1.2"),
    # memory figures: the allocator's and the process's footprint (torchtitan's `memory: 4.23GiB(5.33%)`)
    ("memory: 4.23GiB(5.33%) loss 2.1", "memory: #GiB(#%) loss 2.1"),
    ("mem 1234MB loss 2.3", "mem #MB loss 2.3"),
    ("max_memory_allocated 1234.5 peak mem: 3.2 GB", "max_memory_allocated # peak mem: # GB"),
    ('{"gpu_mem": 1200, "loss": 0.5}', '{"gpu_mem": #, "loss": 0.5}'),
]
KEPT = [
    "step 10 loss 0.1234",
    "epoch 2: train_loss 0.123 val_acc 0.93 lr 0.001 grad_norm 1.23",
    "accuracy 93.5% (935/1000)",
    "lr 3e-4 weight decay 1e-2",
    "timestep 5 reward -1.5",
    "saved checkpoint to ckpt/epoch-3.pt",
    "params: 1.2M, batches 32",
    "3 steps, 12 samples, 4 seconds_budget_flag",
    "best epoch 7 score 0.8123",
    "digest a3f0c1d2e5b6",
    # words that only look like timings: a count, a schedule's setting, English words ending in `ups`/`pers`
    "|    total_timesteps | 2048     |",
    "|    ep_rew_mean     | -1.2e+03 |",
    "global_step=1000, episodic_return=[12.]",
    "elapsed_steps 100 time_step 5 timesteps_total: 4000",
    "eta_min: 0.001 groups: 4 helpers: 3",
    "Data: 1000 samples loaded, gb_free 10.2",
    "Loss 6.9e+00 (6.9e+00)\tAcc@1   0.00 (  0.10)",
    # settings that only look like memory figures
    "memory_efficient 3 mem_fraction 0.5 members 12 remember 3",
]


@pytest.mark.parametrize("line, expected", MASKED)
def test_volatile_tokens_are_masked(line: str, expected: str) -> None:
    assert mask_line(line) == expected


@pytest.mark.parametrize("line", KEPT)
def test_results_are_never_masked(line: str) -> None:
    assert mask_line(line) == line


def test_a_carriage_return_progress_line_is_what_the_terminal_shows() -> None:
    line = ("\r 10%|#  | 1/10 [00:00<00:01, 9.1it/s]\r 50%|##### | 5/10 [00:01<00:01, 4.2it/s]"
            "\r100%|#| 10/10 [00:02<00:00, 5.0it/s]")
    assert visible(line) == "100%|#| 10/10 [00:02<00:00, 5.0it/s]"
    assert mask_line(line) == "100%|#| 10/10 [<elapsed>, #it/s]"
    assert visible("done\r") == "done"
    assert visible("\r\r") == ""


finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
units = st.sampled_from(["ms", "s", " s", "sec", "it/s", "s/it", " samples/s", " tokens/s", " tok/s", "ms/batch"])
words = st.sampled_from(["time", "Time:", "elapsed", "eta", "mfu", "throughput:", "step_time=", "took"])


@given(finite, finite, units)
def test_two_timings_with_a_unit_mask_alike(a: float, b: float, unit: str) -> None:
    assert mask_line(f"step 3 | {a:.2f}{unit}") == mask_line(f"step 3 | {b:.3f}{unit}")


@given(finite, finite, words)
def test_two_values_after_a_timing_word_mask_alike(a: float, b: float, word: str) -> None:
    assert mask_line(f"iter 7 {word} {a:.4g}") == mask_line(f"iter 7 {word} {b}")


@given(finite, finite, finite, finite)
def test_losses_still_differ_when_the_timings_beside_them_are_masked(loss_a: float, loss_b: float, t_a: float,
                                                                     t_b: float) -> None:
    a, b = f"step 1 loss {loss_a:.6f} time {t_a:.2f}ms", f"step 1 loss {loss_b:.6f} time {t_b:.2f}ms"
    assert (mask_line(a) == mask_line(b)) == (f"{loss_a:.6f}" == f"{loss_b:.6f}")


labels = st.sampled_from(["ms/step:", "ms/step", "sec/it", "s/it", "ms=", "secs:", "tok/s:", "it/s"])
keys = st.sampled_from(["loss", "val_acc:", "acc", "f1=", "score", "grad min:"])


@given(finite, finite, keys, labels, finite)
def test_a_metric_before_a_timing_label_is_never_masked(a: float, b: float, key: str, label: str, t: float) -> None:
    line_a, line_b = f"{key} {a:.4f} {label} {t:.2f}", f"{key} {b:.4f} {label} {t * 2:.2f}"
    assert (mask_line(line_a) == mask_line(line_b)) == (f"{a:.4f}" == f"{b:.4f}")


@given(finite, finite, finite, finite, st.sampled_from(["ms", "s", "sec", "seconds", "min"]))
def test_a_timing_with_a_plain_unit_before_a_metric_masks_the_timing_only(t_a: float, t_b: float, a: float,
                                                                          b: float, unit: str) -> None:
    line_a, line_b = f"step 3 {t_a:.1f} {unit} {a:.4f}", f"step 3 {t_b:.2f} {unit} {b:.4f}"
    assert (mask_line(line_a) == mask_line(line_b)) == (f"{a:.4f}" == f"{b:.4f}")


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
def test_masking_is_idempotent(line: str) -> None:
    once = mask_line(line)
    assert mask_line(once) == once


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Nd"), blacklist_characters="\r\x1b"),
               max_size=80))
def test_a_line_without_digits_escapes_or_carriage_returns_is_unchanged(line: str) -> None:
    assert mask_line(line.replace("?", "")) == line.replace("?", "")


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode())
    return path


def test_the_first_differing_line_is_found_and_counted_from_one(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", "epoch 1 loss 0.5 time 1.0ms\nepoch 2 loss 0.4 time 1.1ms\n")
    b = _write(tmp_path / "b", "epoch 1 loss 0.5 time 2.0ms\nepoch 2 loss 0.3 time 1.1ms\n")
    assert first_difference(a, b, "masked") == (2, "epoch 2 loss 0.4 time 1.1ms", "epoch 2 loss 0.3 time 1.1ms")
    assert first_difference(a, b, "strict") == (1, "epoch 1 loss 0.5 time 1.0ms", "epoch 1 loss 0.5 time 2.0ms")


def test_output_that_ends_early_differs_at_the_missing_line(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", "one\ntwo\n")
    b = _write(tmp_path / "b", "one\n")
    found = compare_stdout([a, b], [0, 1], "masked")
    assert found is not None
    assert found.line == 2
    assert found.lines == {0: "two", 1: None}


def test_the_earliest_line_across_repeats_names_every_repeat_differing_there(tmp_path: Path) -> None:
    ref = _write(tmp_path / "0", "a 1\nb 2\nc 3\n")
    late = _write(tmp_path / "1", "a 1\nb 2\nc 4\n")
    early = _write(tmp_path / "2", "a 1\nb 9\nc 3\n")
    same = _write(tmp_path / "3", "a 1\nb 7\nc 3\n")
    found = compare_stdout([ref, late, early, same], [0, 1, 2, 3], "strict")
    assert found is not None
    assert found.line == 2
    assert found.reference == 0
    assert found.lines == {0: "b 2", 2: "b 9", 3: "b 7"}
    assert found.repeats == [2, 3]


def test_progress_lines_with_carriage_returns_compare_by_what_is_shown(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", "\r1/3 9.0it/s\r3/3 8.0it/s\nloss 0.1\n")
    b = _write(tmp_path / "b", "\r1/3 4.0it/s\r2/3 5.0it/s\r3/3 6.0it/s\r\nloss 0.1\n")
    assert compare_stdout([a, b], [0, 1], "masked") is None
    found = compare_stdout([a, b], [0, 1], "strict")
    assert found is not None
    assert found.line == 1
    assert found.lines == {0: "3/3 8.0it/s", 1: "3/3 6.0it/s"}


def test_long_lines_are_cut_for_the_report(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", "x" * 5000 + "1\n")
    b = _write(tmp_path / "b", "x" * 5000 + "2\n")
    found = compare_stdout([a, b], [0, 1], "strict")
    assert found is not None
    assert all(len(t or "") <= 241 for t in found.lines.values())


def test_ignore_and_single_repeats_compare_nothing(tmp_path: Path) -> None:
    a, b = _write(tmp_path / "a", "1\n"), _write(tmp_path / "b", "2\n")
    assert compare_stdout([a, b], [0, 1], "ignore") is None
    assert compare_stdout([a], [0], "strict") is None


def test_recorded_and_combined_modes() -> None:
    assert recorded_mode(RunRecord("t.py", stdout="strict")) == "strict"
    assert recorded_mode(RunRecord("t.py", ignore_stdout=True)) == "ignore"  # a run recorded before --stdout existed
    assert recorded_mode(RunRecord("t.py")) == "masked"
    assert recorded_mode(RunRecord("t.py", stdout="bogus")) == "masked"
    assert most_lenient(["strict", "ignore", "masked"]) == "ignore"
    assert most_lenient(["strict", "masked"]) == "masked"
    assert most_lenient([]) == "masked"


ADVERSARIAL = ["1" * 200_000, "a_" * 100_000, "time(" * 40_000, "time (" * 40_000, "per_" * 50_000,
               "00:01<" * 30_000, "1:" * 100_000, "-" * 200_000, "e1" * 100_000, "\x1b[" * 100_000]


@pytest.mark.slow  # 2 s of CPU over megabytes of text
def test_masking_stays_linear_on_adversarial_lines() -> None:
    """A hang guard, not a timing: a quadratic pattern would take hours on these 200k-character lines
    (they took minutes at 100k before the patterns were bounded); linear masking takes well under a second."""
    done: list[int] = []

    def work() -> None:
        for line in ADVERSARIAL:
            mask_line(line)
            done.append(1)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert len(done) == len(ADVERSARIAL), f"masking hung on {ADVERSARIAL[len(done)][:8]!r}…"


# -- bytes, not decoded text -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["strict", "masked"])
def test_lines_differing_only_in_invalid_utf8_differ(tmp_path: Path, mode: str) -> None:
    """A review found them equal (decoded with errors="replace", every bad byte became one U+FFFD)."""
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.write_bytes(b"ok\nid \x80\x81 loss 0.5\n")
    b.write_bytes(b"ok\nid \x80\xfe loss 0.5\n")
    found = compare_stdout([a, b], [0, 1], mode)  # type: ignore[arg-type]
    assert found is not None
    assert found.line == 2
    assert found.lines == {0: "id \\x80\\x81 loss 0.5", 1: "id \\x80\\xfe loss 0.5"}  # shown apart, not as "�"


@given(st.binary(max_size=40), st.binary(max_size=40))
def test_masked_comparison_never_equates_lines_whose_non_masked_bytes_differ(a: bytes, b: bytes) -> None:
    """Whatever the bytes: lines without digits (nothing to mask) differ under masking iff their tokens do."""
    a, b = (x.translate(None, b"0123456789\r\n\x1b?") for x in (a, b))
    ta, tb = ([t for t in re.split(rb"[ \t]+", x) if t] for x in (a, b))  # padding: spaces and tabs
    key_a, key_b = (comparison_key(mask_line(x.decode("utf-8", "surrogateescape"))) for x in (a, b))
    if ta != tb and not any(set(x) & set("|%━╸╺█▏▎▍▌▋▊▉▐░▒▓-=─═_~#<>".encode()) for x in (a, b)):
        assert key_a != key_b


# -- padding, widths and framework output --------------------------------------------------------------------------


def _same(lines_a: list[str], lines_b: list[str]) -> bool:
    ma, mb = Masker(), Masker()
    return [comparison_key(ma.mask(x)) for x in lines_a] == [comparison_key(mb.mask(x)) for x in lines_b]


# (repeat a, repeat b): lines recorded from seeded runs of Lightning 2.6 (rich and tqdm bars), HF Trainer 5.x,
# keras, fastai-style tables and hand-written formats; each pair differs only in measurements
RECORDED_EQUAL = [
    # word_language_model: `'| time: {:5.2f}s |'` crossing a power of ten (issue 25)
    (["| end of epoch   1 | time:  9.87s | valid loss  5.79 | valid ppl   326.95"],
     ["| end of epoch   1 | time: 10.02s | valid loss  5.79 | valid ppl   326.95"]),
    # Lightning's rich progress bar: the bar shrinks by a character as the rate gains a digit
    (["Epoch 1/1  ━━━━━━━━━━━━━━━━━━ 5/5 0:00:00 • 0:00:00 86.99it/s train_loss: 1.258      "],
     ["Epoch 1/1  ━━━━━━━━━━━━━━━━━ 5/5 0:00:00 • 0:00:00 524.74it/s train_loss: 1.258      "]),
    # Lightning's tqdm bar, redrawn with \r; tqdm pads a shorter line with spaces
    (["\rEpoch 0:  60%|██████    | 3/5 [00:00<00:00, 97.31it/s, v_num=1, train_loss=1.810] "
      "\rEpoch 0:  60%|██████    | 3/5 [00:00<00:00, 96.79it/s, v_num=1, train_loss=2.140]"],
     ["\rEpoch 0:  60%|██████    | 3/5 [00:00<00:00, 168.83it/s, v_num=1, train_loss=1.810]"
      "\rEpoch 0:  60%|██████    | 3/5 [00:00<00:00, 167.83it/s, v_num=1, train_loss=2.140]"]),
    # tqdm's unscaled rate is `{:5.2f}`: `,  6.97it/s` / `, 37.82it/s`; a dynamic-width bar
    ([" 67%|██████▋   | 2/3 [00:01<00:00,  1.39it/s]"], [" 67%|██████████████▋       | 2/3 [00:00<00:00, 37.82it/s]"]),
    (["100%|##########| 3/3 [00:01<00:00,  1.77it/s]"], ["100%|###############| 3/3 [00:00<00:00, 112.10it/s]"]),
    # HF Trainer: per-step logs (metrics, equal) and the closing dict, measurements quoted and keyed by name
    (["{'loss': '0.6926', 'grad_norm': '0.2047', 'learning_rate': '5e-05', 'epoch': '0.3333'}",
      "{'train_runtime': '1.874', 'train_samples_per_second': '12.8', 'train_steps_per_second': '1.601', "
      "'train_loss': '0.6934', 'epoch': '1'}"],
     ["{'loss': '0.6926', 'grad_norm': '0.2047', 'learning_rate': '5e-05', 'epoch': '0.3333'}",
      "{'train_runtime': '12.79', 'train_samples_per_second': '8.597', 'train_steps_per_second': '1.075', "
      "'train_loss': '0.6934', 'epoch': '1'}"]),
    (["{'eval_loss': 0.6931, 'eval_runtime': 0.0512, 'eval_samples_per_second': 468.8, 'epoch': 1.0}"],
     ["{'eval_loss': 0.6931, 'eval_runtime': 0.1049, 'eval_samples_per_second': 1,228.5, 'epoch': 1.0}"]),
    # JSON lines and logfmt
    (['{"step": 10, "loss": 0.5123, "step_time": 0.118, "tokens_per_sec": 9812.4}'],
     ['{"step": 10, "loss": 0.5123, "step_time": 1.02, "tokens_per_sec": 10411.9}']),
    (["level=info step=10 loss=0.5123 elapsed=9.8s throughput=812.5"],
     ["level=info step=10 loss=0.5123 elapsed=10.1s throughput=1012.5"]),
    # keras 3
    (["32/32 ━━━━━━━━━━━━━━━━━━━━ 1s 9ms/step - accuracy: 0.8765 - loss: 0.4321"],
     ["32/32 ━━━━━━━━━━━━━━━━━━━━ 12s 102ms/step - accuracy: 0.8765 - loss: 0.4321"]),
    # tables: a measurement column named by its header, aligned by whitespace or by separators
    (["epoch     train_loss  valid_loss  accuracy  time    ", "0         0.512345    0.498765    0.850000  00:09"],
     ["epoch     train_loss  valid_loss  accuracy  time    ", "0         0.512345    0.498765    0.850000  01:12"]),
    (["| epoch | loss   | epoch time (s) |", "|-------|--------|----------------|",
      "|     1 | 0.5000 |           9.50 |"],
     ["| epoch | loss   | epoch time (s) |", "|-------|--------|----------------|",
      "|     1 | 0.5000 |          10.50 |"]),
    (["┃ Epoch ┃ Loss   ┃ it/s  ┃", "│ 1     │ 0.5000 │ 9.12  │"],
     ["┃ Epoch ┃ Loss   ┃ it/s   ┃", "│ 1     │ 0.5000 │ 10.12  │"]),
    (["+-------+---------+", "| step  | time    |", "+-------+---------+", "| 1     | 9.1     |"],
     ["+-------+----------+", "| step  | time     |", "+-------+----------+", "| 1     | 10.01    |"]),
    # cleanrl's ppo.py prints its steps per second after every update
    (["global_step=500, episodic_return=[12.]", "SPS: 82"], ["global_step=500, episodic_return=[12.]", "SPS: 80"]),
    # Stable-Baselines3's table: the value column is as wide as its widest value, the rule as long as the table
    (["-----------------------------", "| time/              |      |", "|    fps             | 998  |",
      "|    iterations      | 1    |", "|    time_elapsed    | 2    |", "|    total_timesteps | 2048 |",
      "-----------------------------"],
     ["------------------------------", "| time/              |       |", "|    fps             | 1012  |",
      "|    iterations      | 1     |", "|    time_elapsed    | 2     |", "|    total_timesteps | 2048  |",
      "------------------------------"]),
    # pytorch/examples imagenet's meters: the value and its running average
    (["Epoch: [0][ 10/500]\tTime  0.123 ( 0.456)\tData  0.012 ( 0.034)\tLoss 6.9077e+00 (6.9077e+00)"],
     ["Epoch: [0][ 10/500]\tTime  1.123 ( 1.456)\tData  0.102 ( 0.134)\tLoss 6.9077e+00 (6.9077e+00)"]),
    # pandas-style: the measurement column's width pads the header too
    (["   epoch  loss  time", "0      1  0.51  9.81"], ["   epoch  loss   time", "0      1  0.51  10.81"]),
]
RECORDED_DIFFERENT = [
    (["Epoch 1/1  ━━━━━━━━━━━━━━━━━━ 5/5 0:00:00 • 0:00:00 86.99it/s train_loss: 1.258"],
     ["Epoch 1/1  ━━━━━━━━━━━━━━━━━━ 5/5 0:00:00 • 0:00:00 86.99it/s train_loss: 1.259"], "train_loss"),
    (["Epoch 0: 100%|██████████| 5/5 [00:00<00:00, 150.50it/s, v_num=0, train_loss=1.600]"],
     ["Epoch 0: 100%|██████████| 5/5 [00:00<00:00, 107.69it/s, v_num=1, train_loss=1.600]"], "v_num"),
    (["{'train_runtime': '1.874', 'train_loss': '0.6934', 'epoch': '1'}"],
     ["{'train_runtime': '2.874', 'train_loss': '0.6935', 'epoch': '1'}"], "train_loss"),
    (['{"step": 10, "val_acc": 0.93, "step_time": 0.118}'], ['{"step": 10, "val_acc": 0.94, "step_time": 0.118}'],
     "val_acc"),
    (["step=10 loss=0.5123 elapsed=9.8s"], ["step=10 loss=0.5124 elapsed=9.8s"], "loss"),
    (["| epoch | val_acc | time |", "|     1 |  0.9312 | 9.50 |"],
     ["| epoch | val_acc | time |", "|     1 |  0.9313 | 9.50 |"], "column val_acc"),
    (["epoch  train_loss  time", "0      0.512345    00:09"], ["epoch  train_loss  time", "0      0.512346    00:09"],
     "column train_loss"),
    (["| end of epoch   1 | time:  9.87s | valid loss  5.79 |"],
     ["| end of epoch   1 | time: 10.02s | valid loss  5.80 |"], "loss"),
    (["global_step=500, episodic_return=[12.]", "SPS: 82"], ["global_step=500, episodic_return=[13.]", "SPS: 80"],
     "episodic_return"),
    (["|    ep_rew_mean     | -120     |", "|    fps             | 998      |"],
     ["|    ep_rew_mean     | -121     |", "|    fps             | 1012     |"], "ep_rew_mean"),
    (["Epoch: [0][ 10/500]\tTime  0.123 ( 0.456)\tAcc@1   0.00 (  0.10)"],
     ["Epoch: [0][ 10/500]\tTime  0.124 ( 0.457)\tAcc@1   0.00 (  0.20)"], None),
]


@pytest.mark.parametrize("a, b", RECORDED_EQUAL)
def test_measurements_in_framework_output_compare_equal(a: list[str], b: list[str]) -> None:
    assert _same(a, b)


@pytest.mark.parametrize("a, b, field", RECORDED_DIFFERENT)
def test_a_metric_beside_them_still_differs_and_is_named(tmp_path: Path, a: list[str], b: list[str],
                                                         field: str | None) -> None:
    assert not _same(a, b)
    ref, other = _write(tmp_path / "a", "\n".join(a) + "\n"), _write(tmp_path / "b", "\n".join(b) + "\n")
    found = compare_stdout([ref, other], [0, 1], "masked")
    assert found is not None
    assert found.field == field


magnitudes = st.floats(min_value=-1e7, max_value=1e7, allow_nan=False, allow_infinity=False)
widths = st.integers(min_value=0, max_value=14)
aligns = st.sampled_from(["", "<", ">", "^"])
seps = st.sampled_from(["", ","])
# a measurement in each of the places the rules recognise it, `{}` its formatted value
MEASURED = st.sampled_from([
    "| time: {}s |", "{{'train_runtime': '{}', 'train_loss': '0.6934'}}", '{{"step_time": {}, "loss": 0.5}}',
    "step=3 elapsed={} loss=0.51", "step 3 | {} ms/batch | loss 0.51", "5/5 [00:01<00:00, {}it/s, loss=0.51]",
    "eta {} loss 0.51", "throughput: {} samples/s", "latency={}ms acc=0.9",
])


def _formatted(value: float, width: int, align: str, sep: str, digits: int) -> str:
    return format(value, f"{align}{width}{sep}.{digits}f")


@given(MEASURED, magnitudes, magnitudes, widths, widths, aligns, aligns, seps, seps,
       st.integers(0, 4), st.integers(0, 4))
def test_width_sign_digits_and_alignment_of_masked_values_never_count(
        template: str, a: float, b: float, wa: int, wb: int, la: str, lb: str, sa: str, sb: str, da: int,
        db: int) -> None:
    line_a = template.format(_formatted(a, wa, la, sa, da))
    line_b = template.format(_formatted(b, wb, lb, sb, db))
    assert _same([line_a], [line_b]), (line_a, line_b)


@given(magnitudes, magnitudes, widths, widths, st.integers(1, 4))
def test_a_table_column_of_measurements_never_counts(a: float, b: float, wa: int, wb: int, digits: int) -> None:
    header = "epoch  loss    time"
    rows = [f"1      0.5123  {a:<{wa}.{digits}f}", f"1      0.5123  {b:<{wb}.{digits}f}"]
    assert _same([header, rows[0]], [header, rows[1]])


metric_values = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
# a metric beside a measurement, in each format: `{m}` the metric, `{t}` the measurement
BESIDE = st.sampled_from([
    "{{'train_runtime': '{t}', 'train_loss': '{m}'}}", '{{"val_acc": {m}, "step_time": {t}}}',
    "loss={m} elapsed={t}s", "5/5 [00:01<00:00, {t}it/s, train_loss={m}]", "| loss {m} | time: {t}s |",
    "val_acc: {m} ms/step: {t}", "acc {m} sec/it {t}", "Epoch 1/1 ━━━━ 5/5 0:00:00 • 0:00:00 {t}it/s loss: {m}",
])


@given(BESIDE, metric_values, metric_values, magnitudes, magnitudes, widths, widths)
def test_a_metric_change_always_counts(template: str, ma: float, mb: float, ta: float, tb: float, wa: int,
                                       wb: int) -> None:
    line_a = template.format(m=f"{ma:.4f}", t=f"{ta:{wa}.2f}".strip())
    line_b = template.format(m=f"{mb:.4f}", t=f"{tb:{wb}.2f}".strip())
    assert _same([line_a], [line_b]) == (f"{ma:.4f}" == f"{mb:.4f}"), (line_a, line_b)


def test_prose_is_no_table_header_and_a_pipe_after_a_percentage_is_no_bar() -> None:
    # single-spaced words naming a timing are a sentence, not a header: the numbers below stay compared
    assert not _same(["Training time summary", "epoch 0.5123 3"], ["Training time summary", "epoch 0.5124 3"])
    assert not _same(["acc:93%|loss 0.5123|"], ["acc:93%|loss 0.5124|"])
    assert _same(["acc:93%|###6      | 3/5"], ["acc:93%|#######6          | 3/5"])
