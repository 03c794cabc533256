"""Running the script: a fresh interpreter per repeat (launcher, torchrun), the child that becomes
the script, the run directory and the files detaudit writes."""
