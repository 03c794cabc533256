"""`detaudit batch` (docs/batch.md) as one slice, above the shared stages it reuses (the audit pipeline's
repeats, the trace reader, the comparison of repeats): does a request's result depend on what else is in its
batch?

- auditing.py: run the script with the batch probe on, read the probes' events, diagnose, report;
- finding.py: a repeat's probe events -> a BatchFinding (verdict, sizes, first variant); no torch;
- diagnosis.py: why rows depend on their batch -> the `batch-*` causes;
- reporting.py: BatchReport, its JSON form (`detaudit-batch`) and HTML page.

What must live elsewhere: the probes themselves run inside each repeat, where torch is
(recorder/batchprobe.py, isolated by recorder/batchisolation.py), and the command's options and terminal
rendering sit with the other commands (cli/batch_command.py), which this package may not import.
"""
