"""Benchmark evaluation: its config (`config`), loaders (`benchmarks`), graders (`graders`) and lm-eval-style
outputs (`results`). Import the submodules directly; nothing heavy is imported here."""
