"""Shared choices: the allowed values of flags that more than one job (and the engine) accepts.

One definition each; job configs, styles, graders and the Ray layer import them from here.
"""

from __future__ import annotations

BACKENDS = ("ray", "local")
GRADERS = ("strict", "reference")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")
MESSAGE_DTYPES = ("auto", "bf16", "fp32", "bfloat16", "float32")
MODEL_PRESETS = ("tiny", "demo", "paper")
LATENT_NORMS = ("none", "embedding")
"""How spliced latent rows are scaled: none (the release) or embedding (LatentMAS, non-reference)."""
