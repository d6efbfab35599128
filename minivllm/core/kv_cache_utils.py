"""Block hashing for prefix caching (vLLM: v1/core/kv_cache_utils.py).

A full block's hash covers its parent's hash, its own tokens and extra keys, so equal hashes mean equal
prefixes, not just equal blocks: the same 16 tokens at two positions hash differently.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

BlockHash = int | bytes

NONE_HASH: BlockHash = 0


def init_none_hash(seed: int | None = None) -> None:
    """The parent hash of the first block; fixed by seed (or PYTHONHASHSEED), random otherwise."""
    global NONE_HASH
    if seed is None:
        env = os.environ.get("PYTHONHASHSEED")
        seed = int(env) if env and env != "random" else int.from_bytes(os.urandom(8), "little")
    NONE_HASH = hash((0x6D696E69, seed))  # ints only: not salted by PYTHONHASHSEED


init_none_hash(0)


def sha256(obj: Any) -> bytes:
    """A collision-resistant block hash (slower than the builtin)."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def hash_block_tokens(hash_function: Callable[[Any], BlockHash], parent_block_hash: BlockHash | None,
                      curr_block_token_ids: Sequence[int], extra_keys: tuple | None = None) -> BlockHash:
    """Hash one full block, chained to its parent (None = the first block, hashed from NONE_HASH)."""
    if parent_block_hash is None:
        parent_block_hash = NONE_HASH
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def get_request_block_hasher(block_size: int, hash_function: Callable[[Any], BlockHash] = hash):
    """A function that returns the hashes of a request's newly full blocks (given those it has)."""

    def request_block_hasher(request) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        tokens = request.all_token_ids
        num_tokens = len(tokens)
        if start + block_size > num_tokens:
            return []
        parent = request.block_hashes[-1] if request.block_hashes else None
        new_hashes = []
        while start + block_size <= num_tokens:
            parent = hash_block_tokens(hash_function, parent, tokens[start:start + block_size])
            new_hashes.append(parent)
            start += block_size
        return new_hashes

    return request_block_hasher
