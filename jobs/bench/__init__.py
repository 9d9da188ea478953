"""Performance measurements: each script reports ratios measured within one run, with the machine's load."""
