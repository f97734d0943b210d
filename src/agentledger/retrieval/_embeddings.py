"""Optional embeddings of chunks and queries (``pip install 'agentledger[embeddings]'``).

The model is WordLlama's default (``l2_supercat``, 256 dimensions): its weights and
tokenizer ship inside the ``wordllama`` wheel and load from there, with downloads
disabled, so it works offline and never reaches a model hub. Vectors are unit length,
stored as little-endian float32 bytes next to their chunk in the store.

Not installed, or ``AGENTLEDGER_EMBEDDINGS=0``: :func:`embedder` is None and retrieval
is full-text search alone.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from agentledger import _envsettings as envsettings

log = logging.getLogger(__name__)

ENV = "AGENTLEDGER_EMBEDDINGS"
DIMENSIONS = 256


class Embedder:
    """Texts to unit vectors (float32 bytes) with one named model."""

    def __init__(self, model: Any, name: str) -> None:
        self._model = model
        self.name = name

    def embed(self, texts: list[str]) -> list[bytes]:
        """One vector per text, as little-endian float32 bytes of unit length."""
        import numpy as np

        if not texts:
            return []
        vectors = np.asarray(self._model.embed(texts, norm=True), dtype="<f4")
        return [row.tobytes() for row in vectors]


@functools.cache
def _load() -> Embedder | None:
    try:
        import wordllama
    except ImportError:
        return None
    package = Path(wordllama.__file__).parent
    try:
        # The wheel's own files (weights/, tokenizers/), never a download.
        model = wordllama.WordLlama.load(
            config="l2_supercat", dim=DIMENSIONS, cache_dir=package, disable_download=True
        )
    except Exception as exc:  # a broken install: say so once, search by text alone
        log.warning("embeddings off: the wordllama model does not load (%s)", exc)
        return None
    return Embedder(model, f"wordllama:l2_supercat:{DIMENSIONS}")


def embedder() -> Embedder | None:
    """The process's embedding model, loaded on first use; None when not installed or
    turned off with ``AGENTLEDGER_EMBEDDINGS=0``."""
    if not envsettings.current().embeddings:
        return None
    return _load()
