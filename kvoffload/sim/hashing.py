"""Chained content hashes of token blocks: the keys of the engine's prefix cache and of the cache server.

A block's hash covers its parent's hash and its own token ids, so equal hashes mean equal prefixes (as
in vLLM's prefix caching and LMCache's chunk keys). Hashes come from BLAKE2b over the token ids'
bytes, never Python's `hash()`, so two engine processes and the cache server agree on every key.
Pure functions; no IO.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

_DIGEST = 16


def chain_hashes(token_ids: Sequence[int], block_size: int, seed: bytes = b"") -> list[bytes]:
    """Hashes of every full `block_size` block of `token_ids`, each chained to the one before.

    `seed` separates namespaces (e.g. the model name), so equal tokens under different models differ.
    A trailing partial block gets no hash: only full blocks are cacheable.
    """
    out: list[bytes] = []
    parent = hashlib.blake2b(seed, digest_size=_DIGEST).digest()
    full = len(token_ids) // block_size
    ids = array("I", token_ids[: full * block_size])
    raw = ids.tobytes()
    width = block_size * ids.itemsize
    for i in range(full):
        h = hashlib.blake2b(parent, digest_size=_DIGEST)
        h.update(raw[i * width : (i + 1) * width])
        parent = h.digest()
        out.append(parent)
    return out
