"""The one cache root for models built or converted offline (tiny test models, packaged models).

Kept free of heavy imports so configs and CLIs can name it without loading torch.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Local cache for built and converted models (`$RECMAS_CACHE`, else ~/.cache/recmas_ray)."""
    return Path(os.environ.get("RECMAS_CACHE", Path.home() / ".cache" / "recmas_ray"))


