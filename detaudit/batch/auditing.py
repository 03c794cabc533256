"""`detaudit batch`: run the script with the batch probe on, read the probes' events, diagnose, report.

The same stages as `run`: the launcher starts each repeat in a fresh interpreter (run/launcher.py through
`pipeline.execute`), the recorder probes inside it (recorder/batchprobe.py) and writes events into the
trace, batch/finding.py reads them, batch/diagnosis.py explains a variant finding, batch/reporting.py holds
the result. One repeat answers the question; with `--repeats N` the repeats are also compared with each
other (`compare_traces`, as `run` does). The run directory holds the repeats' files and `batch.json`.
"""

from __future__ import annotations

from collections.abc import Callable

from detaudit.audit.pipeline import AuditOptions, execute
from detaudit.batch.diagnosis import diagnose_batch
from detaudit.batch.finding import analyse
from detaudit.batch.reporting import BatchReport, BatchSettings, write_json
from detaudit.compare.traces import compare_traces
from detaudit.errors import TraceError
from detaudit.results import RepeatResult
from detaudit.run.launcher import Interrupted, check_script
from detaudit.run.rundir import BATCH_FILE, new_run_dir, stored_args
from detaudit.trace import RecordStream

PREFIX = "batch"


def run_batch(options: AuditOptions, settings: BatchSettings,
              on_done: Callable[[RepeatResult], None] | None = None) -> BatchReport:
    """Run the repeats with the probe on and build the report (written to the run directory as batch.json).

    One repeat records no module outputs (granularity `step`: the probes' events are the result); more
    record modules, so the repeats can be compared with each other too.
    """
    target, schedule = options.target, options.schedule
    check_script(target.script)
    run_dir = new_run_dir(target.script, options.out_dir)
    probe = {"module": settings.module, "batch_dim": settings.batch_dim, "sizes": list(settings.sizes)}
    recorded = options.recorded(granularity="module" if schedule.repeats > 1 else "step",
                                child_config={"batch": probe})
    try:
        results = execute(recorded, run_dir, on_done, prefix=PREFIX)
    except Interrupted as exc:
        exc.run_dir = run_dir
        raise
    traces = [run_dir / r.trace for r in results]
    present = [t for t in traces if t.is_file()]
    if not present:
        raise TraceError(f"{run_dir}: no repeat left a trace (see {run_dir / results[0].stderr})")
    stream = RecordStream(present[0])
    stream.drain()  # the events of the first repeat; the others probed the same calls
    finding = analyse(stream.events)  # type: ignore[arg-type]  # schema-checked by the reader
    run_to_run, detail = None, None
    if len(results) > 1:
        if len(present) < len(traces):
            run_to_run = "not compared: a repeat left no trace"
        else:
            comparison = compare_traces(traces, [r.device for r in results], options.checks.tolerance,
                                        [r.timed_out for r in results])
            first = comparison.first_divergence
            run_to_run = "divergent" if first is not None else "deterministic"
            if first is not None:
                what = first.record.name if first.record is not None else first.category
                detail = f"repeats first differ at record {first.index} ({what})" + (
                    f": {first.detail}" if first.detail else "")
    report = BatchReport(script=target.as_typed, script_args=stored_args(target.script_args, target.redact_args),
                         run_dir=str(run_dir), settings=settings, results=results, finding=finding,
                         causes=diagnose_batch(finding), run_to_run=run_to_run, run_to_run_detail=detail)
    write_json(report, run_dir / BATCH_FILE, mode=0o600)
    return report
