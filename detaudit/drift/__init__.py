"""`detaudit drift`'s slice (docs/drift.md): one script under two configurations A and B, B's difference from A
judged record by record against A's own noise floor (A re-run with its reduction order perturbed).

Above the stages it reuses: the launcher through `audit.pipeline.execute` (each configuration recorded as
`run` records it), the trace reader, and `run --perturb`'s settings (pin.py) for the floor. Its command is
cli/drift_command.py.
"""
