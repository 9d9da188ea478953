"""The config of the performance benchmark behind `jobs/bench/speed.py` (figures (a)-(d), measured by
`jobs/bench/perf.py`): plain config types, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import NonEmpty, OneOf, Range, WritableDir
from recmas_ray.config.recursion import MAX_LATENT_STEPS, MAX_NEW_TOKENS, MAX_ROUNDS
from recmas_ray.system.config import SystemConfig

FIGURES = tuple("abcdefg")


@dataclass(kw_only=True)
class BenchConfig:
    """What the benchmark runs."""

    SYSTEM_FIELDS = ("style", "preset", "role_models", "device", "dtype", "seed")
    """System fields the benchmark reads (the others get no flag and are refused when set): it measures fresh links."""
    FLAG_ALIASES = {"role_model": "system.role_models"}
    """The benchmark's spelling of the per-role base models (config/cli.py)."""

    system: SystemConfig = field(default_factory=lambda: SystemConfig(style="sequential_light", preset="demo",
                                                                      seed=0))
    """The system measured: style, base models (preset demo: real small models), device, dtype and seed (of the
    links and questions)."""
    num_questions: Annotated[int, Range(1, 4096)] = 4
    """Questions per batch (one batch)."""
    rounds: Annotated[list[int], Range(1, MAX_ROUNDS), NonEmpty()] = field(default_factory=lambda: [1, 2, 3])
    """R values for (a)."""
    latent_steps: Annotated[int, Range(0, MAX_LATENT_STEPS)] = 16
    """m for (a) and (c)."""
    rollout_steps: Annotated[list[int], Range(1, MAX_LATENT_STEPS), NonEmpty()] = \
        field(default_factory=lambda: [16, 32, 64])
    """m values for (b)."""
    max_new_tokens: Annotated[int, Range(1, MAX_NEW_TOKENS)] = 48
    """Decoding budget of every text step."""
    repeats: Annotated[int, Range(1, 1000)] = 3
    """Repetitions per figure; the median is reported."""
    figures: Annotated[list[str], OneOf(FIGURES), NonEmpty()] = field(default_factory=lambda: list("abcdef"))
    """Figures to measure (see jobs/bench/perf.py): a end to end, b rollout caches, c Ray backend, d latent
    step vs token, e prefix KV reuse over rounds, f decode loop, g torch.compile (minutes on CPU; not default)."""
    ray: bool = True
    """Measure (c) (starts a local Ray cluster)."""
    output_path: Annotated[str, WritableDir()] = "out/bench"
    """Where bench.json, bench.png and config.json go."""

    def validate(self) -> None:
        self.system.check_tables("--role_model")


def quick() -> BenchConfig:
    """A few minutes on CPU: 1 repetition, 2 questions, short decodes."""
    return BenchConfig(num_questions=2, repeats=1, max_new_tokens=24, latent_steps=8)
