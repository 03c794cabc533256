"""Comparing recordings: traces side by side, op rules, stdout and exit statuses, what a verdict rests on."""
