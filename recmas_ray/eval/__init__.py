"""Benchmark evaluation (top floor): its config (`config`), the run (`run`, `stream`), the reference protocol
(`protocol`) and lm-eval-style outputs (`samples`, `results`). The task families it grades with, their benchmarks'
sources and loaders live on the engine floor in `recmas_ray.tasks`. Import the submodules directly; nothing heavy
is imported here."""
