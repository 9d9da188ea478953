"""How one batch of questions runs: decoding, the recursion (method, R, m) and the toolcaller's tool loop.

These configs are shared by evaluation, serving, the Python API and the performance jobs; the engine
(`engine/agent.py`, `engine/runner.py`, `tools/loop.py`) reads them. Upper bounds keep a typo from becoming a run
that never ends (a billion latent steps); they are far above anything the paper uses (m <= 128, R <= 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from recmas_ray.config.checks import OneOf, Range
from recmas_ray.config import inputs

METHODS = ("recursive_mas", "recursive_textmas", "textmas", "single_agent", "text_relay", "rollout_as_text")
LATENT_ABLATIONS = ("none", "shuffle", "zero")
MAX_LATENT_STEPS = 4096
MAX_ROUNDS = 32
MAX_NEW_TOKENS = 65536


@dataclass(kw_only=True)
class DecodeConfig:
    """Text decoding settings (the release samples with T=0.6, top_p=0.95; tests use greedy)."""

    SHORT_FLAGS = ("do_sample", "max_new_tokens", "temperature", "top_k", "top_p")
    """Fields with a plain flag (`--name`) wherever this section is nested (config/cli.py)."""

    max_new_tokens: Annotated[int, Range(1, MAX_NEW_TOKENS)] = 256
    """Budget of generated tokens per sample."""
    do_sample: bool = False
    """Sample instead of greedy argmax."""
    temperature: Annotated[float, Range(0, 100, lo_open=True)] = 0.6
    """Sampling temperature (only with do_sample; > 0, use greedy decoding for T = 0)."""
    top_p: Annotated[float, Range(0, 1, lo_open=True)] = 0.95
    """Nucleus sampling mass (only with do_sample)."""
    top_k: Annotated[int, Range(-1, 1_000_000)] = 0
    """Keep only the k most likely tokens when sampling (0 disables; -1 takes the decoding model's
    generation config, transformers' 50 when it names none: what the release's run.py does)."""
    seed: Annotated[int, Range(0, 2**63 - 1)] = 0
    """Seed of the sampling generator, so sampled runs repeat."""


@dataclass(kw_only=True)
class RecursionConfig:
    """How one batch is run."""

    SHORT_FLAGS = ("decode_every_round", "latent_ablation", "latent_steps", "method", "num_recursive_rounds")
    """Fields with a plain flag (`--name`) wherever this section is nested (config/cli.py)."""

    method: Annotated[str, OneOf(METHODS)] = "recursive_mas"
    """recursive_mas (latents between agents), recursive_textmas (the same loop with text),
    textmas (one round of text), single_agent (the decoder alone), text_relay (one round: each sender states
    what it knows, as text) or rollout_as_text (recursive_mas's rollouts read out as their argmax tokens and sent
    as text); see recmas_ray/engine/relay.py."""
    num_recursive_rounds: Annotated[int, Range(1, MAX_ROUNDS)] = 3
    """R: rounds of the agent loop (textmas always runs one)."""
    latent_steps: Annotated[int, Range(0, MAX_LATENT_STEPS)] = 32
    """m: latent steps per agent and round (recursive_mas only; 0 sends empty latent blocks)."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """Final (and, for text methods, intermediate) decoding settings."""
    decode_every_round: bool = False
    """Mixture reference behaviour: the decoder also decodes (and discards) text in non-final rounds."""
    latent_ablation: Annotated[str, OneOf(LATENT_ABLATIONS)] = "none"
    """recursive_mas only, a diagnostic: none, shuffle (each question receives the latents of the next
    question in its batch, a cyclic shift) or zero (every received latent block is zeros)."""
    adaptive_threshold: Annotated[float | None, Range(0, None)] = None
    """recursive_mas only: stop a question's recursion early once its decoder's latent input stops changing
    (None: off, every question runs all R rounds). Before the decoder's step of round r (2 <= r < R) the change
    is ||x_r - x_{r-1}|| / ||x_{r-1}||, the relative L2 distance of the question's latent blocks on the edges
    into the decoder in rounds r and r-1 (all blocks of the question flattened into one fp32 vector); below the
    threshold the decoder decodes from round r's blocks, exactly as a fixed R = r run would, and the question
    reports r rounds. 0 runs the checks but never stops (the fixed-R outputs)."""


@dataclass(kw_only=True)
class ToolLoopConfig:
    """Tool settings of the deliberation toolcaller."""

    SHORT_FLAGS = ("echo_last_expr", "max_tool_rounds", "python_timeout_s", "result_max_chars", "stop_window_tokens",
                   "tavily_keys_file")
    """Fields with a plain flag (`--name`) wherever this section is nested (config/cli.py)."""

    max_tool_rounds: Annotated[int, Range(0, 100)] = 5
    """Most tool calls per sample; a further call gets the "[tool limit reached]" note."""
    python_timeout_s: Annotated[float, Range(0, 3600, lo_open=True)] = 10.0
    """Wall-clock (and, rounded up, CPU) limit of one Python call, in seconds."""
    result_max_chars: Annotated[int, Range(1, 1_000_000)] = 6000
    """Characters kept of one tool result."""
    tavily_keys_file: str | None = None
    """File with one Tavily key per line, read on the toolcaller's machine (TAVILY_API_KEY is used as
    well); with neither, search answers "search unavailable"."""
    echo_last_expr: bool = False
    """Print the value of a final bare expression of Python code, like the interactive interpreter."""
    stop_window_tokens: Annotated[int, Range(1, 4096)] = 16
    """Decoded tokens searched for a closing tag after each step (reference: 16)."""

    def validate(self) -> None:
        """The keys file, when named, must be a regular file only its owner can read (checked before any
        model loads or Ray starts)."""
        if self.tavily_keys_file is not None:
            inputs.check_keys_file("--tavily_keys_file", self.tavily_keys_file)
