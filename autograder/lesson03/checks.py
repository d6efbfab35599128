"""Lesson 3 — BlockPool 与 Prefix Caching: the checks behind the grade cells, the live demos and the figures.

The student writes four small pieces (the exercise cell of solutions/lesson03):
    hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None)
    request_block_hasher(request, block_size=16, hash_function=hash)      # Request.block_hashes
    get_computed_blocks(self, request)                                    # a KVCacheManager method
    get_new_blocks(self, num_blocks)                                      # a BlockPool method

Input space (each dimension, and the graded part that covers it):
    prefix caching        on: every part; off (no lookup): boundary, and the reference outputs of real_engine
    block_size            16 (main_path, real_engine), 4 and 32 (boundary): an argument, never a constant
    hash_function         Python's hash (engine), sha256 (main_path, boundary): an argument, never a constant
    prompt length         < 1 block, exactly k blocks (the n-1 cap), every length around a block edge: boundary
    tokens hashed         prompt and generated tokens (growing one token at a time; a multi-turn hit on
                          generated text): boundary, real_engine; a preempted request resumed: boundary
    hash inputs           parent chain (same tokens at two positions), token order, extra keys, sha256: main_path,
                          boundary; two prompts that differ only in the last (or first) token of a full block:
                          boundary
    free-queue order      vLLM's test_evict: unhashed blocks at the head, hashed ones LRU from the head; new
                          blocks from the head: main_path, real_engine; a block that lost its hash while free
                          (EngineCore._fail_step), in the middle or at the tail of the queue, keeps its place
                          (new blocks still from the head): main_path, real_engine (a failed step)
    batch shapes          8 requests sharing a prefix at once, arrivals under eviction pressure: real_engine
    async scheduling      off; it does not change which blocks are hashed or hit

Grade cells and `python -m autograder check lesson03 ...` call the check_* functions here (each docstring says
what it covers); main path and boundary end with every operation equal to the pinned vLLM's own.
"""
from __future__ import annotations

import contextlib
import functools
import random
import time
import types
from dataclasses import dataclass, field
from unittest import mock

from autograder.common import (
    CheckFailed,
    Lesson,
    SourceMap,
    blank_in_function,
    expect,
    graded,
    student_error,
)
from autograder.pin import VLLM_VERSION

BLOCK = 16
FUNCS = ("hash_block_tokens", "request_block_hasher", "get_computed_blocks", "get_new_blocks")
COMMON = [i for i in range(3) for _ in range(BLOCK)]  # vLLM test_prefill: three full blocks of 16


# ---------------------------------------------------------------------------- building blocks
def make_request(request_id: str, prompt: list[int], request_block_hasher=None, block_size: int = BLOCK,
                 hash_function=hash):
    """A minivllm Request whose block_hashes come from the given hasher (the student's, or minivllm's)."""
    from minivllm.core.kv_cache_utils import get_request_block_hasher
    from minivllm.request import Request
    from minivllm.sampling_params import SamplingParams

    if request_block_hasher is None:
        hasher = get_request_block_hasher(block_size, hash_function)
    else:
        hasher = functools.partial(request_block_hasher, block_size=block_size, hash_function=hash_function)
    return Request(request_id, list(prompt), SamplingParams(max_tokens=17), eos_token_id=100,
                   block_hasher=hasher)


def make_manager(num_blocks: int, get_computed_blocks=None, get_new_blocks=None, block_size: int = BLOCK,
                 enable_caching: bool = True):
    """minivllm's KVCacheManager, with the student's two methods bound on this instance only."""
    from minivllm.core.kv_cache_manager import KVCacheManager

    manager = KVCacheManager(num_blocks, block_size, 8192, enable_caching)
    if get_computed_blocks is not None:
        manager.get_computed_blocks = types.MethodType(get_computed_blocks, manager)
    if get_new_blocks is not None:
        manager.block_pool.get_new_blocks = types.MethodType(get_new_blocks, manager.block_pool)
    return manager


def free_ids(manager) -> list[int]:
    """The free queue from the LRU head (evicted first) to the tail."""
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]


def _ids(blocks) -> list[int]:
    return blocks.get_block_ids() if blocks is not None else None


def _computed_blocks(manager, request):
    """get_computed_blocks(request), its shape checked: (KVCacheBlocks, number of hit tokens)."""
    from minivllm.core.kv_cache_manager import KVCacheBlocks

    got = manager.get_computed_blocks(request)
    expect(isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], KVCacheBlocks),
           f"get_computed_blocks 应返回 (KVCacheBlocks, 命中 token 数)，实际返回 {got!r}。")
    expect(isinstance(got[1], int), f"命中 token 数应是 int，实际 {got[1]!r}。")
    return got


def _computed(manager, request) -> tuple[list[int], int]:
    blocks, n = _computed_blocks(manager, request)
    return blocks.get_block_ids(), n


# ---------------------------------------------------------------------------- against the pinned vLLM
OPS_ZH = {"add": "加入请求：块哈希", "hit": "get_computed_blocks：命中的块、token 数",
          "alloc": "allocate_slots：新分到的块、剩余空闲块数", "append": "追加生成的 token：块哈希",
          "free": "free：空闲队列（LRU 队头在前）", "preempt": "抢占（free，进度清零）：空闲队列"}


def run_vllm_view(name: str, request_block_hasher=None, get_computed_blocks=None, get_new_blocks=None) -> list:
    """autograder/lesson03/vllm_view.py's scenario `name`, operation by operation, on minivllm's KVCacheManager
    with the student's pieces plugged (None: minivllm's own), by the same driver vLLM's answer came from."""
    from autograder import vllm_oracle
    from autograder.lesson03.vllm_view import run_ops

    return run_ops(lambda n, bs: make_manager(n, get_computed_blocks, get_new_blocks, block_size=bs),
                   lambda rid, prompt, bs: make_request(rid, prompt, request_block_hasher, block_size=bs),
                   _computed_blocks, vllm_oracle.scenarios("lesson03")[name])


def compare_with_vllm(request_block_hasher, get_computed_blocks, get_new_blocks, prefixes: tuple) -> None:
    """Every operation of every recorded scenario named prefixes*: the same answer as the pinned vLLM's own
    KVCacheManager and BlockPool (block hashes compared by their equalities, numbered by first appearance)."""
    from autograder import vllm_oracle

    for name in vllm_oracle.scenarios("lesson03"):
        if not name.startswith(prefixes):
            continue
        want = vllm_oracle.recorded("lesson03", name)
        try:
            got = run_vllm_view(name, request_block_hasher, get_computed_blocks, get_new_blocks)
        except CheckFailed:
            raise
        except Exception as e:  # noqa: BLE001 - the student's pieces broke the manager: name the scenario
            raise CheckFailed(f"与 vLLM {VLLM_VERSION} 的 KVCacheManager 对照（场景 {name}）：运行出错（{student_error(e)}）；"
                              f"vLLM 在这个场景里逐个操作的结果是 {want}。") from None
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            expect(g == w, f"与 vLLM {VLLM_VERSION} 的 KVCacheManager 对照（场景 {name}）第 {k + 1} 个操作「{w[0]} {w[1]}」"
                           f"（{OPS_ZH[w[0]]}）：vLLM 得到 {w[2:]}，你的实现得到 {g[2:]}（块哈希按首次出现的顺序编号）。")


# ---------------------------------------------------------------------------- part checks
def _require_filled(*funcs) -> None:
    """A function that still names `______` fails here, with the blank's message, before it runs."""
    for fn in funcs:
        code = getattr(fn, "__code__", None)
        expect(callable(fn), f"{fn!r} 应是一个函数。")
        if code is not None and "______" in code.co_names:
            raise blank_in_function(fn)


@graded
def check_main_path(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks) -> None:
    """Main path: vLLM's test_prefill, then the hash chain's contract and test_evict/test_hash_block_correct_reuse.
    Covers: block_size 16, the parent chain, token order, sha256 keys, free-queue order, new blocks from the head."""
    _require_filled(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks)
    # The visible assertions, verbatim.
    manager = make_manager(11, get_computed_blocks, get_new_blocks)
    req0 = make_request("0", COMMON + [3] * 7, request_block_hasher)
    expect(len(req0.block_hashes) == 3, f"55 个 token = 3 个满块 + 7 个 token：应有 3 个块哈希，实际 {len(req0.block_hashes)} 个。")
    computed, n = _computed_blocks(manager, req0)
    expect(computed.blocks == [] and n == 0, f"空缓存上不应命中，实际命中块 {computed.get_block_ids()}、{n} 个 token。")
    got = _ids(manager.allocate_slots(req0, 55, n, computed))
    expect(got == [1, 2, 3, 4], f"req0 应从 LRU 队头拿到块 [1, 2, 3, 4]，实际 {got}。")
    req1 = make_request("1", COMMON + [3] * 5, request_block_hasher)
    computed, n = _computed_blocks(manager, req1)
    expect(computed.get_block_ids() == [1, 2, 3] and n == 48,
           f"同样 3 个满块 + 5 个 token：应命中块 [1, 2, 3]、48 个 token，实际 {computed.get_block_ids()}、{n}。")
    got = _ids(manager.allocate_slots(req1, 53 - 48, n, computed))
    expect(got == [5], f"命中 48 个 token 后只需再分配 1 个块 [5]，实际 {got}。")
    expect([b.ref_cnt for b in computed.blocks] == [2, 2, 2],
           f"共享块的 ref_cnt 应为 [2, 2, 2]，实际 {[b.ref_cnt for b in computed.blocks]}。")

    # The rest of vLLM's test_prefill: free order, a hit on free (cached) blocks, eviction in queue order.
    manager.free(req0)
    manager.free(req1)
    expect(free_ids(manager) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1],
           f"释放后空闲队列应为 [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]（无哈希的尾块在队头），实际 {free_ids(manager)}。")
    req2 = make_request("2", COMMON + [3] * 6, request_block_hasher)
    computed, n = _computed_blocks(manager, req2)
    expect(computed.get_block_ids() == [1, 2, 3] and n == 48,
           f"块已空闲但哈希还在：仍应命中 [1, 2, 3]、48 个 token，实际 {computed.get_block_ids()}、{n}。")
    got = _ids(manager.allocate_slots(req2, 53 - 48, n, computed))
    expect(got == [5], f"命中空闲块后新块应取自 LRU 队头 [5]，实际 {got}。")
    manager.free(req2)
    req3 = make_request("3", [99] * 160, request_block_hasher)
    computed, n = _computed_blocks(manager, req3)
    expect(n == 0, f"全新的 prompt 不应命中，实际命中 {n} 个 token。")
    got = _ids(manager.allocate_slots(req3, 160, n, computed))
    expect(got == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1],
           f"要用光所有块时，应按空闲队列从头到尾驱逐 [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]，实际 {got}。")
    expect(not any(manager.block_pool.get_cached_block(h) is not None for h in req0.block_hashes),
           "块被重新分配时必须把它旧的哈希从缓存表里驱逐（_maybe_evict_cached_block），否则旧哈希会命中新内容。")

    _check_chain(hash_block_tokens, request_block_hasher)
    check_eviction_order(get_computed_blocks, get_new_blocks, request_block_hasher)
    _check_stale_hash_evicted(request_block_hasher, get_computed_blocks, get_new_blocks)
    _check_hash_lost_while_free(request_block_hasher, get_computed_blocks, get_new_blocks)
    _check_hit_stops_at_first_miss(request_block_hasher, get_computed_blocks, get_new_blocks)
    compare_with_vllm(request_block_hasher, get_computed_blocks, get_new_blocks, ("demo_", "main_"))


def _check_chain(hash_block_tokens, request_block_hasher) -> None:
    from minivllm.core import kv_cache_utils

    a, b = list(range(16)), list(range(16, 32))
    h = hash_block_tokens(hash, None, a)
    expect(h == hash_block_tokens(hash, None, tuple(a)), "同样的 token（list 或 tuple）必须得到同样的哈希。")
    expect(h == hash_block_tokens(hash, kv_cache_utils.NONE_HASH, a),
           "第一个块（parent_block_hash=None）应以 NONE_HASH 作为父哈希。")
    expect(hash_block_tokens(hash, h, a) != h, "父哈希不同，同样的 token 必须得到不同的哈希（哈希要链起来）。")
    expect(hash_block_tokens(hash, None, b) != h, "token 不同，哈希必须不同。")
    expect(hash_block_tokens(hash, None, a, ("lora-1",)) != h,
           "extra_keys 不同（LoRA、cache_salt、多模态），哈希必须不同。")
    expect(hash_block_tokens(hash, None, a[::-1]) != h,
           "同一块的 token 换了顺序，哈希必须不同（键要保留 token 的顺序，不能排序或变成集合）。")
    expect(hash_block_tokens(hash, None, [1] * 8 + [2] * 8) != hash_block_tokens(hash, None, [1] * 4 + [2] * 12),
           "同样几种 token、重复次数不同，哈希必须不同（键要保留每个 token，不能去重）。")
    # sha256 needs a picklable, deterministic key: the same inputs must give the same bytes.
    expect(hash_block_tokens(kv_cache_utils.sha256, h, a) == hash_block_tokens(kv_cache_utils.sha256, h, list(a)),
           "用 sha256 时同样的输入也必须得到同样的哈希。")
    tokens = [7] * 40
    req = make_request("chain", tokens, request_block_hasher)
    expect(len(req.block_hashes) == 2, f"40 个 token 只有 2 个满块，应有 2 个哈希，实际 {len(req.block_hashes)}。")
    h0 = hash_block_tokens(hash, None, tokens[:16])
    h1 = hash_block_tokens(hash, h0, tokens[16:32])
    expect(req.block_hashes == [h0, h1], "request_block_hasher 应把每个块的哈希链到前一个块的哈希上。")


def check_eviction_order(get_computed_blocks, get_new_blocks, request_block_hasher=None) -> list[int]:
    """vLLM test_evict at the pin: blocks freed tail-first, the unhashed partial block 6 to the head (#42656),
    give the free order [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]; a request that hits blocks 1 and 2 takes its new
    block from the LRU head: block 6. Returns the free order."""
    manager = make_manager(11, get_computed_blocks, get_new_blocks)
    last = 5 * 16 + 7
    req0 = make_request("0", list(range(last)), request_block_hasher)
    computed, n = _computed_blocks(manager, req0)
    got = _ids(manager.allocate_slots(req0, last, n, computed))
    expect(got == [1, 2, 3, 4, 5, 6], f"test_evict：req0 应拿到 [1, 2, 3, 4, 5, 6]，实际 {got}。")
    req1 = make_request("1", list(range(last, last + 3 * 16)), request_block_hasher)
    computed, n = _computed_blocks(manager, req1)
    got = _ids(manager.allocate_slots(req1, 3 * 16, n, computed))
    expect(got == [7, 8, 9], f"test_evict：req1 应拿到 [7, 8, 9]，实际 {got}。")
    manager.free(req0)
    manager.free(req1)
    order = free_ids(manager)
    expect(order == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7],
           f"test_evict：释放后空闲队列应为 [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]（无哈希的块 6 放到队头），实际 {order}。")
    req2 = make_request("2", list(range(2 * 16 + 3)), request_block_hasher)
    computed, n = _computed_blocks(manager, req2)
    expect(computed.get_block_ids() == [1, 2] and n == 32,
           f"test_evict：req2 应命中 [1, 2]、32 个 token，实际 {computed.get_block_ids()}、{n}。")
    got = _ids(manager.allocate_slots(req2, 3, n, computed))
    expect(got == [6], f"test_evict：新块应从 LRU 队头驱逐，得到 [6]；实际 {got}（从队尾取会拿到 7）。")
    expect(manager.block_pool.get_num_free_blocks() == 7,
           f"test_evict：最后应剩 7 个空闲块，实际 {manager.block_pool.get_num_free_blocks()}。")
    return order


def _check_hash_lost_while_free(request_block_hasher, get_computed_blocks, get_new_blocks) -> None:
    """A free block whose hash was dropped while it sat in the queue (EngineCore._fail_step drops the hashes of
    a failed step's freed blocks) keeps its place: the queue order is the eviction order, so new blocks still
    come from the LRU head, hashed or not."""
    manager = make_manager(11, get_computed_blocks, get_new_blocks)
    req = make_request("0", list(range(10 * BLOCK)), request_block_hasher)
    manager.allocate_slots(req, 10 * BLOCK)
    manager.free(req)  # all 10 blocks hashed, freed tail-first: [10, 9, ..., 1]
    pool = manager.block_pool
    pool._maybe_evict_cached_block(pool.blocks[3])  # as _fail_step: block 3 loses its hash while free
    order = free_ids(manager)
    new = make_request("1", list(range(500, 500 + BLOCK + 1)), request_block_hasher)
    got = _ids(manager.allocate_slots(new, BLOCK + 1))
    expect(got == order[:2],
           f"空闲队列 {order} 里块 3 在空闲时丢了哈希（如 EngineCore._fail_step）：新请求要 2 个块，应从 LRU 队头取 "
           f"{order[:2]}，实际 {got}。")


def _check_stale_hash_evicted(request_block_hasher, get_computed_blocks, get_new_blocks) -> None:
    """vLLM test_hash_block_correct_reuse: a cached block reused for new content loses its old hash."""
    manager = make_manager(2, get_computed_blocks, get_new_blocks)
    req = make_request("0", list(range(16)), request_block_hasher)
    manager.allocate_slots(req, 16)
    old = manager.block_pool.blocks[1].block_hash
    manager.free(req)
    req = make_request("1", list(range(15)), request_block_hasher)
    manager.allocate_slots(req, 15)
    expect(manager.block_pool.get_cached_block(old) is None and manager.block_pool.blocks[1].block_hash is None,
           "块 1 被重新分配装新内容时，它旧的哈希必须被驱逐；否则之后的请求会“命中”已被覆盖的 KV。")


def _check_hit_stops_at_first_miss(request_block_hasher, get_computed_blocks, get_new_blocks) -> None:
    manager = make_manager(11, get_computed_blocks, get_new_blocks)
    req = make_request("0", list(range(4 * 16 + 1)), request_block_hasher)
    manager.allocate_slots(req, 4 * 16 + 1)
    manager.free(req)
    pool = manager.block_pool
    middle = pool.get_cached_block(req.block_hashes[1])
    pool._maybe_evict_cached_block(middle)  # block 2 of the chain is gone
    again = make_request("1", list(range(4 * 16 + 1)), request_block_hasher)
    ids, n = _computed(manager, again)
    expect(n == 16 and len(ids) == 1,
           f"第 2 个块已被驱逐：命中必须在第一次未命中处停下（只剩第 1 块，16 个 token），实际命中 {ids}、{n}。")


def _check_block_edge_tokens(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks) -> None:
    """Two prompts that differ in one token only, at a block's edge: every token of a full block is in its hash
    (hash_block_tokens and the hasher's slice), so the hit stops before the block that differs."""
    a = list(range(500, 516))
    for i, where in ((15, "最后一个"), (0, "第一个")):
        b = list(a)
        b[i] = 999
        expect(hash_block_tokens(hash, None, a) != hash_block_tokens(hash, None, b),
               f"两个块只差{where} token：哈希必须不同（块里的每个 token 都要进哈希键）。")
    base = list(range(600, 600 + 3 * BLOCK + 1))  # 3 full blocks + 1 token
    manager = make_manager(20, get_computed_blocks, get_new_blocks)
    first = make_request("edge0", base, request_block_hasher)
    manager.allocate_slots(first, len(base))
    for pos, want in ((2 * BLOCK - 1, BLOCK), (BLOCK - 1, 0), (BLOCK, BLOCK), (3 * BLOCK - 1, 2 * BLOCK)):
        other = list(base)
        other[pos] = 999
        req = make_request(f"edge{pos}", other, request_block_hasher)
        ids, n = _computed(manager, req)
        expect(n == want, f"两个 {len(base)} 个 token 的 prompt 只差第 {pos} 个 token（块 {pos // BLOCK + 1} 的"
                          f"{'最后一个' if pos % BLOCK == BLOCK - 1 else '第一个'}）：第二个应只命中它前面的 {want} 个 token，"
                          f"实际命中 {ids}、{n}（一个块的每个 token 都要进它的哈希）。")


@graded
def check_boundary(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks) -> None:
    """Boundaries: the n-1 cap, prompts shorter than a block, partial blocks, positions, growing requests.
    Covers: the cap at every length around a block edge, caching off, a resumed preempted request, extra keys,
    block_size 4 and 32, hash_function sha256 (arguments, not constants)."""
    _require_filled(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks)
    manager = make_manager(11, get_computed_blocks, get_new_blocks)
    full = make_request("full", COMMON, request_block_hasher)
    manager.allocate_slots(full, 48)
    again = make_request("again", COMMON, request_block_hasher)
    ids, n = _computed(manager, again)
    expect(n == 32 and ids == [1, 2],
           f"prompt 恰好是 3 个满块（48 个 token）且全部已缓存：命中上限是 47，只能命中 [1, 2]、32 个 token，"
           f"实际 {ids}、{n}（最后一个 token 必须重算，才能得到采样下一个 token 的 logits）。")
    short = make_request("short", [5] * 15, request_block_hasher)
    expect(short.block_hashes == [], f"15 个 token 装不满一个块，不应有哈希，实际 {short.block_hashes}。")
    expect(_computed(manager, short)[1] == 0, "不足一个块的 prompt 不可能命中。")
    same = make_request("same", [7] * 32 + [1], request_block_hasher)
    expect(len(set(same.block_hashes)) == 2,
           "同样的 16 个 token 出现在两个位置：两个块的哈希必须不同（父哈希不同）。")

    _check_block_edge_tokens(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks)

    # Hidden: the cap at every length around a block boundary, on a warm cache.
    manager = make_manager(20, get_computed_blocks, get_new_blocks)
    base = list(range(100, 100 + 64))
    warm = make_request("warm", base, request_block_hasher)
    manager.allocate_slots(warm, 64)
    for length, want in ((1, 0), (16, 0), (17, 16), (32, 16), (33, 32), (48, 32), (49, 48), (64, 48)):
        req = make_request(f"len{length}", base[:length], request_block_hasher)
        _, n = _computed(manager, req)
        expect(n == want, f"已缓存 64 个 token 的前缀，长 {length} 的 prompt 应命中 {want} 个 token（上限 {length - 1}，"
                          f"按整块取），实际 {n}。")
    off = make_manager(11, get_computed_blocks, get_new_blocks, enable_caching=False)
    ids, n = _computed(off, make_request("off", COMMON, request_block_hasher))
    expect(ids == [] and n == 0, f"关闭 prefix caching 时不应查缓存，实际命中 {ids}、{n}。")

    # Hidden: a preempted request resumes with prompt + outputs: the cap is all its tokens minus one, not the prompt.
    manager = make_manager(20, get_computed_blocks, get_new_blocks)
    req = make_request("resumed", list(range(200, 240)), request_block_hasher)
    manager.allocate_slots(req, 40)
    req.num_computed_tokens = 40
    req.append_output_token_ids(list(range(1, 25)))
    manager.allocate_slots(req, 24)
    manager.free(req)  # preempted by recompute: blocks freed (still cached), progress forgotten
    req.num_computed_tokens = 0
    ids, n = _computed(manager, req)
    expect(n == 48, f"被抢占后恢复的请求有 40 个 prompt token + 24 个输出 token，全部已缓存：命中上限是 64 - 1，"
                    f"应命中 3 块 48 个 token，实际 {ids}、{n}（上限要按全部 token 算，不是 prompt 长度）。")

    # Hidden: hashes grow one block at a time as a request decodes, and equal hashing it all at once.
    req = make_request("grow", list(range(30)), request_block_hasher)
    expect(len(req.block_hashes) == 1, f"30 个 token 应有 1 个块哈希，实际 {len(req.block_hashes)}。")
    req.append_output_token_ids([1, 2])
    expect(len(req.block_hashes) == 2, f"长到 32 个 token 时第 2 个块满了，应有 2 个哈希，实际 {len(req.block_hashes)}。")
    req.append_output_token_ids([3])
    at_once = make_request("at-once", list(range(30)) + [1, 2, 3], request_block_hasher)
    expect(req.block_hashes == at_once.block_hashes,
           "逐 token 增长时追加的哈希，应与一次性哈希同样 token 的结果相同（从已有的最后一个哈希接着链）。")
    expect(hash_block_tokens(hash, None, [7] * 16, None) != hash_block_tokens(hash, None, [7] * 16, ("salt",)),
           "extra_keys 必须进入哈希：不同租户的 cache_salt 不能共享块。")

    # Hidden: hash_function is an argument (vLLM's prefix_caching_hash_algo, e.g. sha256 for caches shared
    # across processes), never Python's hash: the chain must be built with the function passed in.
    from minivllm.core import kv_cache_utils

    tokens = list(range(400, 440))
    req = make_request("sha", tokens, request_block_hasher, hash_function=kv_cache_utils.sha256)
    want, parent = [], None
    for i in range(len(tokens) // BLOCK):
        parent = hash_block_tokens(kv_cache_utils.sha256, parent, tokens[i * BLOCK:(i + 1) * BLOCK])
        want.append(parent)
    expect(req.block_hashes == want, "hash_function=sha256 时，request_block_hasher 的块哈希应是用 sha256 逐块成链的结果，"
                                     "实际不同（要用参数 hash_function，不能写死 Python 的 hash）。")

    # Hidden: block_size is an argument (the engine's --block-size), never 16: blocks of 4 tokens.
    for bs in (4, 32):
        manager = make_manager(40, get_computed_blocks, get_new_blocks, block_size=bs)
        ref = make_request(f"ref{bs}", list(range(300, 350)), block_size=bs)  # minivllm's hasher: the reference
        warm = make_request(f"warm{bs}", list(range(300, 350)), request_block_hasher, block_size=bs)
        expect(len(warm.block_hashes) == len(ref.block_hashes) == 50 // bs,
               f"block_size={bs}：50 个 token 应有 {50 // bs} 个块哈希，实际 {len(warm.block_hashes)}（块大小要用参数 block_size）。")
        manager.allocate_slots(warm, 50)
        probe = make_request(f"probe{bs}", list(range(300, 340)), request_block_hasher, block_size=bs)
        want = (39 // bs) * bs
        _, n = _computed(manager, probe)
        expect(n == want, f"block_size={bs}：已缓存 50 个 token，长 40 的 prompt 应命中 {want} 个 token"
                          f"（上限 39，按整块取），实际 {n}（块大小要用 self.block_size）。")
    compare_with_vllm(request_block_hasher, get_computed_blocks, get_new_blocks, ("boundary_",))


# The accepted names, as sha256 prefixes of the lower-cased last dotted component (so `Class.name`,
# `self.x.name()` and `name` are the same answer; never the names themselves, since this file ships to
# students). Checked against vllm/v1/core/kv_cache_manager.py, block_pool.py, kv_cache_utils.py and
# single_type_kv_cache_manager.py in the pinned vLLM (autograder/pin.py); the lesson's own
# text does not print them. The first three appear in lines the reading cell shows (get_computed_blocks L250,
# _maybe_evict_cached_block L694, free_blocks L732); the lesson names the class or function holding the other two.
SOURCE = SourceMap(["lookup_gate", "evict_hashes", "null_flag", "free_link", "hashed_count"], {
    "lookup_gate": {"14f5b04ed22d16b8"},
    "evict_hashes": {"4d116c412567c57e"},
    "null_flag": {"34f9b9053278985b"},
    "free_link": {"9276061bbabed055"},
    "hashed_count": {"5286dc009c20f1e2"},
})


# ---------------------------------------------------------------------------- the real engine
def make_core(enable_prefix_caching: bool = True, num_gpu_blocks: int = 128, max_num_seqs: int = 16,
              trace: bool = False):
    """An in-process minivllm EngineCore on the CPU (torch attention), the default model."""
    import logging
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from minivllm.config import EngineArgs
    from minivllm.engine.core import EngineCore

    args = EngineArgs(device="cpu", attention_backend="torch", block_size=BLOCK, num_gpu_blocks=num_gpu_blocks,
                      enable_prefix_caching=enable_prefix_caching, max_num_seqs=max_num_seqs, trace=trace)
    return EngineCore.from_engine_args(args)


@contextlib.contextmanager
def plugged(core, hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks):
    """The student's four pieces inside a real EngineCore, for the duration of the block (no edit to minivllm):
    kv_cache_utils.hash_block_tokens patched, the scheduler's block_hasher set (Scheduler.add_request hands it to
    every Request), get_computed_blocks / get_new_blocks bound on the engine's KVCacheManager / BlockPool. The
    Scheduler records prefix-cache stats at admission from what get_computed_blocks returned."""
    from minivllm.core import kv_cache_utils
    from minivllm.core.kv_cache_manager import KVCacheBlocks

    kv = core.scheduler.kv_cache_manager
    pool = kv.block_pool
    bs = kv.block_size

    def counted_get_computed_blocks(self, request):
        got = get_computed_blocks(self, request)
        expect(isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], KVCacheBlocks),
               f"get_computed_blocks 应返回 (KVCacheBlocks, int)，实际 {got!r}。")
        return got

    core.scheduler.block_hasher = functools.partial(request_block_hasher, block_size=bs, hash_function=hash)
    with mock.patch.object(kv_cache_utils, "hash_block_tokens", hash_block_tokens), \
            mock.patch.object(kv, "get_computed_blocks", types.MethodType(counted_get_computed_blocks, kv)), \
            mock.patch.object(pool, "get_new_blocks", types.MethodType(get_new_blocks, pool)):
        yield core


@dataclass
class EngineRun:
    """What a workload produced: per request its tokens, logprobs and cached tokens; the prefix-cache stats."""

    tokens: dict = field(default_factory=dict)
    logprobs: dict = field(default_factory=dict)
    cached: dict = field(default_factory=dict)
    queries: int = 0
    hits: int = 0
    steps: int = 0
    after_step: list = field(default_factory=list)  # (stats queries, stats hits) after each request (sequential)
    ttft_ms: dict = field(default_factory=dict)
    snapshot: dict | None = None  # block tables after the first step (see block_table_snapshot)
    new_block_ids: list = field(default_factory=list)
    free_order: list | None = None


def _drive(core, run: EngineRun, max_steps: int, until: str | None = None) -> None:
    """Step until every request (or request `until` has its first token) is done; record outputs."""
    for _ in range(max_steps):
        if not core.scheduler.has_requests():
            return
        try:
            out, _ = core.step()
        except CheckFailed:
            raise
        except Exception as e:  # the student's pieces broke the engine: say where, not a stack trace
            raise CheckFailed(f"真实引擎在第 {run.steps + 1} 步出错：{type(e).__name__}: {e}") from None
        run.steps += 1
        for o in out.outputs:
            run.tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            for d in o.new_logprobs or []:
                run.logprobs.setdefault(o.request_id, []).append(max(d.values()) if d else 0.0)
            if o.new_token_ids:
                run.cached.setdefault(o.request_id, o.num_cached_tokens)
        if until is not None and run.tokens.get(until):
            return
    if until is None and core.scheduler.has_requests():
        raise CheckFailed(f"{max_steps} 步之后仍有请求没完成：有请求一直没有 token 可算"
                          "（是不是命中了整个 prompt，没有留下最后一个 token 重算？）")


def _add(core, rid: str, prompt: list[int], max_tokens: int) -> None:
    from minivllm.engine import EngineCoreRequest
    from minivllm.sampling_params import SamplingParams

    core.add_request(EngineCoreRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                         logprobs=0)))


def _finish(core, run: EngineRun) -> EngineRun:
    stats = core.get_stats()
    run.queries, run.hits = stats.prefix_cache_queries, stats.prefix_cache_hits
    core.shutdown()
    return run


@contextlib.contextmanager
def engine_run(funcs, enable_prefix_caching: bool = True, num_gpu_blocks: int = 128, new_blocks: bool = False):
    """A fresh EngineCore and an empty EngineRun, the four pieces plugged (funcs=None: minivllm's own) for the
    block; with new_blocks, BlockPool.get_new_blocks (the student's, when plugged) also records each allocation's
    block ids. Yields (core, run); the prefix-cache stats are read after the block (_finish)."""
    core, run = make_core(enable_prefix_caching, num_gpu_blocks), EngineRun()
    with plugged(core, *funcs) if funcs else contextlib.nullcontext(), contextlib.ExitStack() as stack:
        pool = core.scheduler.kv_cache_manager.block_pool
        inner = pool.get_new_blocks

        def recording_get_new_blocks(num_blocks):
            blocks = inner(num_blocks)
            run.new_block_ids.append([b.block_id for b in blocks])
            return blocks

        if new_blocks:
            stack.enter_context(mock.patch.object(pool, "get_new_blocks", recording_get_new_blocks))
        yield core, run
    _finish(core, run)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(4, 4000) for _ in range(n)]


def shared_prefix_prompts(num_requests: int = 8, seed: int = 3) -> list[list[int]]:
    """A 64-token system prompt X + X (its blocks 2-3 repeat blocks 0-1: same tokens, other positions) and a
    question of varied length per request; one request is the system prompt alone (a full hit, capped)."""
    rng = random.Random(seed)
    x = _tokens(rng, 32)
    system = x + x
    lengths = [7, 16, 0, 23, 5, 33, 1, 12, 9, 40, 3, 18, 27, 2, 11, 6]
    return [system + _tokens(rng, lengths[i % len(lengths)]) for i in range(num_requests)]


def run_batch(funcs=None, enable_prefix_caching: bool = True, prompts=None, max_tokens: int = 4,
              num_gpu_blocks: int = 128) -> EngineRun:
    """All prompts at once (one schedule admits them all); funcs=None runs minivllm's own pieces."""
    with engine_run(funcs, enable_prefix_caching, num_gpu_blocks) as (core, run):
        for i, p in enumerate(prompts or shared_prefix_prompts()):
            _add(core, f"r{i}", p, max_tokens)
        _drive(core, run, max_steps=8 * max_tokens + 8)
    return run


def pressure_prompts(seed: int = 5) -> list:
    """Sequential (prompt, max_tokens) on 9 usable blocks. A's answer fills its partial block, so A2 (the next
    chat turn: A + A's answer + a new message) hits 4 blocks, one of them hashed from generated tokens; B and D
    push A's blocks out of the LRU queue; C repeats B's prefix; E asks for A's prefix after its eviction."""
    rng = random.Random(seed)
    a, b, d = _tokens(rng, 55), _tokens(rng, 100), _tokens(rng, 60)
    turn2, c_tail, e_tail = _tokens(rng, 10), _tokens(rng, 9), _tokens(rng, 5)
    return [(a, 12), (lambda run: a + run.tokens["r0"] + turn2, 4), (b, 4), (b[:64] + c_tail, 4), (d, 4),
            (a[:32] + e_tail, 4)]


def run_sequential(funcs=None, enable_prefix_caching: bool = True, prompts=None, max_tokens: int = 4,
                   num_gpu_blocks: int = 10, measure_ttft: bool = False) -> EngineRun:
    """One request at a time, each finished before the next arrives; stats recorded after each. A prompt may be
    (prompt, max_tokens), and a prompt may be a function of the run so far (a chat turn that quotes an answer)."""
    with engine_run(funcs, enable_prefix_caching, num_gpu_blocks) as (core, run):
        for i, item in enumerate(prompts or pressure_prompts()):
            prompt, n_out = item if isinstance(item, tuple) else (item, max_tokens)
            prompt = prompt(run) if callable(prompt) else prompt
            rid = f"r{i}"
            t0 = time.perf_counter()
            _add(core, rid, prompt, n_out)
            _drive(core, run, max_steps=4 * n_out + 8, until=rid if measure_ttft else None)
            run.ttft_ms[rid] = (time.perf_counter() - t0) * 1e3
            _drive(core, run, max_steps=4 * n_out + 8)
            stats = core.get_stats()
            run.after_step.append((stats.prefix_cache_queries, stats.prefix_cache_hits))
    return run


def run_eviction_order(funcs=None) -> EngineRun:
    """vLLM test_evict on the engine: req0 (87 tokens) and req1 (48) in one step, both finish and are freed
    tail-first (req0's unhashed partial block to the head); then req2 (35 tokens, 2 blocks shared with req0) takes one new block from the LRU head."""
    with engine_run(funcs, num_gpu_blocks=11, new_blocks=True) as (core, run):
        _add(core, "r0", list(range(87)), 1)
        _add(core, "r1", list(range(87, 87 + 48)), 1)
        _drive(core, run, max_steps=6)
        run.free_order = free_ids(core.scheduler.kv_cache_manager)
        _add(core, "r2", list(range(35)), 1)
        _drive(core, run, max_steps=6)
    return run


def run_failed_step(funcs=None) -> EngineRun:
    """A step that fails on the engine (EngineCore._fail_step): r0 (9 full blocks) finishes and its hashed blocks
    sit in the free queue; r1 takes blocks [10, 9] and its step raises, so r1 ends with an error and its full
    block 10 loses its hash while free, at the queue's tail: [9, 8, ..., 1, 10]. r2 then takes 2 blocks from the
    LRU head ([9, 8]: block 8's hash is evicted), so r3 (r0's prompt again) hits 7 blocks (112 tokens), not 8."""
    import logging

    core_logger = logging.getLogger("minivllm.engine.core")
    with engine_run(funcs, num_gpu_blocks=11, new_blocks=True) as (core, run):
        prompt = list(range(9 * BLOCK))
        _add(core, "r0", prompt, 1)
        _drive(core, run, max_steps=4)
        def failing_execute(scheduler_output, non_block=False):
            raise RuntimeError("a step that fails (the check's)")

        _add(core, "r1", list(range(1000, 1000 + BLOCK + 1)), 1)
        was_disabled, core_logger.disabled = core_logger.disabled, True  # _fail_step logs the error
        try:
            with mock.patch.object(core.model_executor, "execute_model", failing_execute):
                out, _ = core.step()  # the failing step: r1 ends with FinishReason.ERROR
            run.steps += 1
            run.tokens.update({o.request_id: list(o.new_token_ids) for o in out.outputs})
        finally:
            core_logger.disabled = was_disabled
        run.free_order = free_ids(core.scheduler.kv_cache_manager)
        _add(core, "r2", list(range(2000, 2000 + BLOCK + 1)), 1)
        _drive(core, run, max_steps=4)
        _add(core, "r3", prompt, 1)
        _drive(core, run, max_steps=4)
    return run


@functools.cache
def reference_runs() -> dict:
    """minivllm's own pieces (caching on) and caching off, on the same workloads: what the student must match."""
    return {"batch": run_batch(None, True), "batch_off": run_batch(None, False),
            "pressure": run_sequential(None, True), "pressure_off": run_sequential(None, False),
            "failed_step": run_failed_step(None)}


def _same_outputs(got: EngineRun, off: EngineRun, what: str) -> None:
    for rid, want in off.tokens.items():
        expect(got.tokens.get(rid) == want,
               f"{what}：请求 {rid} 开启 prefix caching 的输出 {got.tokens.get(rid)} 与关闭时 {want} 不同"
               "——命中的块里装的不是这个前缀的 KV。")
        worst = max(abs(a - b) for a, b in zip(got.logprobs.get(rid, []), off.logprobs[rid], strict=False)) \
            if got.logprobs.get(rid) else 0.0
        expect(len(got.logprobs.get(rid, [])) == len(off.logprobs[rid]) and worst < 1e-3,
               f"{what}：请求 {rid} 的 logprob 与关闭 prefix caching 时相差 {worst:.2e}（应 < 1e-3）"
               "——命中的块里装的不是这个前缀的 KV。")


@graded
def check_real_engine(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks) -> dict:
    """The four pieces in minivllm's EngineCore: stats equal minivllm's own, outputs equal caching off.
    Covers: a shared-prefix batch (a full hit capped at n-1), test_evict on the engine, eviction pressure with
    a multi-turn hit on generated tokens; prefix caching on vs off."""
    funcs = (hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks)
    _require_filled(*funcs)
    ref = reference_runs()
    batch = run_batch(funcs)
    want = ref["batch"]
    expect(batch.hits > 0, "共享 system prompt 的 8 个请求一个 token 也没有命中：引擎里的前缀缓存没有工作。")
    expect((batch.queries, batch.hits) == (want.queries, want.hits),
           f"共享前缀负载：引擎统计的 prefix cache 查询/命中应为 {want.queries}/{want.hits} 个 token，"
           f"实际 {batch.queries}/{batch.hits}。")
    expect(batch.cached == want.cached, f"每个请求命中的 token 数应为 {want.cached}，实际 {batch.cached}。")
    _same_outputs(batch, ref["batch_off"], "共享前缀负载")

    order = run_eviction_order(funcs)
    expect(order.free_order == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7],
           f"真实引擎上的 test_evict：两个请求结束后空闲队列应为 [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]，实际 {order.free_order}。")
    expect(order.new_block_ids[-1:] == [[6]] and order.cached.get("r2") == 32,
           f"真实引擎上的 test_evict：r2 应命中 32 个 token 并从 LRU 队头拿到块 [6]，"
           f"实际命中 {order.cached.get('r2')}、新块 {order.new_block_ids[-1:]}。")

    failed = run_failed_step(funcs)
    want = ref["failed_step"]
    expect((failed.new_block_ids, failed.cached.get("r3")) == (want.new_block_ids, want.cached.get("r3")),
           f"真实引擎上一步失败之后（EngineCore._fail_step 丢掉失败请求释放的块的哈希，空闲队列为 {want.free_order}）："
           f"各次分配的新块应为 {want.new_block_ids}、r3 命中 {want.cached.get('r3')} 个 token，"
           f"实际 {failed.new_block_ids}、{failed.cached.get('r3')}。")

    pressure = run_sequential(funcs)
    want = ref["pressure"]
    expect(pressure.after_step == want.after_step,
           f"驱逐压力下的顺序负载：每个请求之后的累计查询/命中应为 {want.after_step}，实际 {pressure.after_step}。")
    _same_outputs(pressure, ref["pressure_off"], "驱逐压力下的顺序负载")
    return {"batch": batch, "eviction": order, "pressure": pressure}


LESSON = Lesson(
    lesson_id="lesson03",
    title="BlockPool 与 Prefix Caching：块哈希链、命中与 LRU 驱逐",
    answer=FUNCS,
    code={
        "main_path": ("主路径·vLLM 场景", check_main_path),
        "real_engine": ("主路径·真实引擎", check_real_engine),
        "boundary": ("边界条件", check_boundary),
    },
    source_map=SOURCE,
    questions=("哈希为何成链", "命中为何封顶 n-1", "逆序释放与驱逐"),
)
check_source_map = SOURCE.check
