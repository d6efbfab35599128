"""Lesson 3 on the pinned vLLM: its own KVCacheManager and BlockPool (v1/core/kv_cache_manager.py, block_pool.py) and
Request block hashes (kv_cache_utils.get_request_block_hasher) on the lesson's prefix-cache scenarios.

A scenario is a list of operations on one KVCacheManager, built as vLLM's tests/v1/core/test_prefix_caching.py
builds one (a one-group KVCacheConfig of full attention): add a request (its block hashes), look up its hit
(get_computed_blocks), allocate slots after the hit, append generated tokens, free or preempt it. Every answer is per
operation: the block hashes as first-appearance numbers (hash values differ between engines, their equalities
must not), the hit's block ids and tokens, the new block ids, the free queue from the LRU head. "demo_*" are the
notebook's; "main_*" and "boundary_*" grade the student's four pieces (autograder/lesson03/checks.py) plugged into
minivllm's KVCacheManager. Runs under .venv-vllm only (imports vllm, never minivllm).
"""
from __future__ import annotations

COMMON = [i for i in range(3) for _ in range(16)]  # vLLM test_prefill: three full blocks of 16


def _ops(*ops) -> list:
    return [list(op) for op in ops]


def _lookup_alloc(rid, prompt):
    """Add a request, look its prefix up, allocate the rest of its prompt after the hit."""
    return [("add", rid, list(prompt)), ("hit", rid), ("alloc", rid, len(prompt))]


SCENARIOS = {
    # The lesson's scenarios: vLLM's test_prefill (hit, free order, a hit on free blocks, eviction in queue
    # order) and test_evict (the unhashed partial block at the head of the free queue).
    "demo_prefill": {"num_blocks": 11, "block_size": 16, "ops": _ops(
        *_lookup_alloc("0", COMMON + [3] * 7), *_lookup_alloc("1", COMMON + [3] * 5), ("free", "0"), ("free", "1"),
        *_lookup_alloc("2", COMMON + [3] * 6), ("free", "2"), *_lookup_alloc("3", [99] * 160), ("hit", "0"))},
    "demo_evict": {"num_blocks": 11, "block_size": 16, "ops": _ops(
        *_lookup_alloc("0", list(range(87))), *_lookup_alloc("1", list(range(87, 87 + 48))), ("free", "0"),
        ("free", "1"), *_lookup_alloc("2", list(range(35))))},
    # Main path: a reused block loses its stale hash (test_hash_block_correct_reuse); a chain whose tail was
    # evicted still hits its head; block_size 4 and 32.
    "main_stale_hash": {"num_blocks": 2, "block_size": 16, "ops": _ops(
        *_lookup_alloc("0", list(range(16))), ("free", "0"), *_lookup_alloc("1", list(range(15))), ("hit", "0"))},
    "main_tail_evicted": {"num_blocks": 6, "block_size": 16, "ops": _ops(
        *_lookup_alloc("0", list(range(65))), ("free", "0"), *_lookup_alloc("x", [5] * 17), ("free", "x"),
        *_lookup_alloc("1", list(range(65))))},
    "main_block_size_4": {"num_blocks": 12, "block_size": 4, "ops": _ops(
        *_lookup_alloc("0", list(range(18))), *_lookup_alloc("1", list(range(10)) + [77] * 5), ("free", "1"),
        ("free", "0"), *_lookup_alloc("2", list(range(13))))},
    "main_block_size_32": {"num_blocks": 8, "block_size": 32, "ops": _ops(
        *_lookup_alloc("0", list(range(70))), *_lookup_alloc("1", list(range(64)) + [1]), ("free", "0"),
        ("free", "1"), *_lookup_alloc("2", [9] * 100))},
    # Boundary: the n-1 cap (a fully cached prompt of whole blocks, and one token more), shorter than a block,
    # the same tokens at two positions, one token different at a block's edge, generated tokens hashed as
    # they arrive (a second turn hits the first one's output), a preempted request resumed (prompt + output).
    "boundary_full_hit": {"num_blocks": 11, "block_size": 16, "ops": _ops(
        *_lookup_alloc("full", COMMON), *_lookup_alloc("again", COMMON), ("add", "plus1", COMMON + [3]),
        ("hit", "plus1"), ("add", "short", [5] * 15), ("hit", "short"))},
    "boundary_positions": {"num_blocks": 11, "block_size": 16, "ops": _ops(
        *_lookup_alloc("same", [7] * 32 + [1]), ("add", "tail", [7] * 16 + [8] * 16 + [1]), ("hit", "tail"),
        ("add", "head", [8] * 16 + [7] * 16 + [1]), ("hit", "head"))},
    "boundary_edges": {"num_blocks": 20, "block_size": 16, "ops": _ops(
        *_lookup_alloc("base", list(range(600, 649))),
        *[op for pos in (31, 15, 16, 47) for op in (
            ("add", f"e{pos}", [999 if i == pos else t for i, t in enumerate(range(600, 649))]),
            ("hit", f"e{pos}"))])},
    "boundary_generated": {"num_blocks": 11, "block_size": 16, "ops": _ops(
        *_lookup_alloc("turn1", list(range(20))), ("append", "turn1", list(range(100, 113))),
        ("alloc", "turn1", 33), ("append", "turn1", [200]), ("free", "turn1"),
        *_lookup_alloc("turn2", list(range(20)) + list(range(100, 113)) + [200, 300, 301]))},
    "boundary_resumed": {"num_blocks": 20, "block_size": 16, "ops": _ops(
        *_lookup_alloc("r", list(range(200, 240))), ("append", "r", list(range(1, 25))), ("alloc", "r", 64),
        ("preempt", "r"), ("hit", "r"), ("alloc", "r", 64))},
}


def _ids(blocks) -> list[int]:
    """vLLM's block ids are per KV-cache group (a tuple of lists), minivllm's a list: one group here."""
    ids = blocks.get_block_ids()
    return list(ids[0] if isinstance(ids, tuple) else ids)


def run_ops(make_manager, make_request, get_computed, scenario: dict) -> list:
    """The scenario's operations on one manager; per operation its answer (JSON). Pure Python: runs under either
    venv; only the three callables differ (vLLM's objects or minivllm's with the student's pieces)."""
    manager = make_manager(scenario["num_blocks"], scenario["block_size"])
    canon: dict = {}
    reqs, hits, out = {}, {}, []

    def hashes(req) -> list[int]:
        return [canon.setdefault(h, len(canon)) for h in req.block_hashes]

    def free_queue() -> list[int]:
        return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]

    for op, rid, *arg in scenario["ops"]:
        if op == "add":
            reqs[rid] = make_request(rid, arg[0], scenario["block_size"])
            out.append([op, rid, hashes(reqs[rid])])
        elif op == "hit":
            hits[rid] = get_computed(manager, reqs[rid])
            out.append([op, rid, _ids(hits[rid][0]), hits[rid][1]])
        elif op == "alloc":  # arg: the tokens computed after this step (the scheduler advances the request)
            blocks, n = hits.pop(rid, (None, 0))
            req = reqs[rid]
            got = manager.allocate_slots(req, arg[0] - req.num_computed_tokens - n, n, blocks)
            req.num_computed_tokens = arg[0]
            out.append([op, rid, None if got is None else _ids(got),
                        manager.block_pool.get_num_free_blocks()])
        elif op == "append":
            reqs[rid].append_output_token_ids(list(arg[0]))
            out.append([op, rid, hashes(reqs[rid])])
        elif op in ("free", "preempt"):  # preemption by recompute: blocks freed, progress forgotten
            manager.free(reqs[rid])
            if op == "preempt":
                reqs[rid].num_computed_tokens = 0
            out.append([op, rid, free_queue()])
        else:
            raise ValueError(op)
    return out


def vllm_answer(name: str, payload: dict) -> list:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    init_none_hash(sha256)

    def make_manager(num_blocks, block_size):
        config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            ["layer"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
        return KVCacheManager(config, max_model_len=8192, scheduler_block_size=block_size,
                              hash_block_size=block_size, enable_caching=True)

    def make_request(rid, prompt, block_size):
        return Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=SamplingParams(max_tokens=17),
                       pooling_params=None, block_hasher=get_request_block_hasher(block_size, sha256))

    def get_computed(manager, req):
        blocks, n, _ = manager.get_computed_blocks(req)  # the third: a shared-prefix boundary (hybrid models)
        return blocks, n

    return run_ops(make_manager, make_request, get_computed, payload)
