"""Everything that runs inside an audited repeat: hooks that turn a script's tensors into records."""
