"""Confirmation by experiment: re-run with one source of nondeterminism pinned at a time."""
