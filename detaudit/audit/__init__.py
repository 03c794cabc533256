"""The pipeline: run the repeats, compare, diagnose, build the Report; a torchrun run rank by rank."""
