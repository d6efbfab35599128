# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %%
# COLAB INSTALL CELL: autograder/build.py writes INSTALL_CELL here

# %% [markdown]
# # 第 3 课：BlockPool 与 Prefix Caching：块哈希链、命中与 LRU 驱逐
#
# ## 本课目标与通过标准
#
# 本课产出：说清一个 KV 块怎样被哈希、登记、命中、共享、释放和驱逐；补齐块哈希链、命中规则和驱逐端，接进真实的 minivllm 引擎，用命中统计和“与关闭缓存时输出一致”证明它们是对的。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径：vLLM prefix-cache 场景 1 分，接入真实 EngineCore 1 分 | 2 | 自动 |
# | 代码·边界条件：n-1 封顶、不满的块、同样的 token 在不同位置、只差一个 token 的块、extra keys | 1 | 自动 |
# | 代码·映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行评分规则下的“自检”单元格或 `python -m autograder check lesson03`，得分与 nbgrader 的自动部分一致。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 本课读、跑、评分用的都是 vLLM {{VLLM_VERSION}} 发布包。先画出一个块的一生：分配 → 写满 → 登记哈希 → 被命中共享 → 释放进空闲队列 → 被驱逐或再次命中。再按下表读（约 75 行）：
#
# | 顺序 | vLLM 文件与入口（{{VLLM_VERSION}}，`vllm/v1/core/`） | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `kv_cache_utils.py`：`hash_block_tokens` 的函数体（L617–L623） | `minivllm/core/kv_cache_utils.py`：`hash_block_tokens` | 块哈希里装了什么？为什么带上父块的哈希？ |
# | 2 | `kv_cache_manager.py`：`KVCacheManager.get_computed_blocks` 的封顶与查找（L250–L264） | `minivllm/core/kv_cache_manager.py`：`KVCacheManager` | 命中为什么封顶在 `num_tokens - 1`？ |
# | 3 | `single_type_kv_cache_manager.py`：`FullAttentionManager.find_longest_cache_hit` 的 Phase 1（L731–L739） | 同上 | 为什么第一次未命中就停？ |
# | 4 | `block_pool.py`：`BlockPool.get_new_blocks`（L658–L668）与 `_maybe_evict_cached_block`（L694–L700） | `minivllm/core/block_pool.py`：`BlockPool` | 新块从空闲队列哪一端取？旧哈希何时驱逐？ |
# | 5 | 同文件：`BlockPool.free_blocks`（L719–L742）；调用方 `SingleTypeKVCacheManager.free`（L526–L527） | `minivllm/core/kv_cache_manager.py`：`KVCacheManager.free` | 为什么逆序释放？无哈希的块为什么放队头？ |
#
# 前缀缓存在调度侧，runner 只按块表读写 KV（课程的 dense 模型在 {{VLLM_VERSION}} 默认用 Model Runner V2；minivllm 对应 V1 runner）。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/core/kv_cache_utils.py", "hash_block_tokens", lines=(617, 623))
show_vllm("vllm/v1/core/kv_cache_manager.py", "KVCacheManager.get_computed_blocks", lines=(250, 264))
show_vllm("vllm/v1/core/single_type_kv_cache_manager.py", "FullAttentionManager.find_longest_cache_hit",
          lines=(731, 739))
show_vllm("vllm/v1/core/block_pool.py", "BlockPool.get_new_blocks", lines=(658, 668))
show_vllm("vllm/v1/core/block_pool.py", "BlockPool._maybe_evict_cached_block", lines=(694, 700))
show_vllm("vllm/v1/core/block_pool.py", "BlockPool.free_blocks")
show_vllm("vllm/v1/core/single_type_kv_cache_manager.py", "SingleTypeKVCacheManager.free", lines=(526, 527))

# %% nbgrader={"grade": false, "grade_id": "l03_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr），导入本课的图、演示与检查。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

from autograder import lesson03 as L03  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson03")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# 线上大量请求共享同一段前缀：system prompt、few-shot 示例、RAG 文档、对话历史。没有前缀缓存，每个请求都重新 prefill 这段前缀，TTFT 变高，每个请求各存一份相同的 KV。
#
# vLLM V1 的自动前缀缓存（Automatic Prefix Caching）让 KV 块按内容寻址：
#
# - 每个**装满**的块有一个哈希，代表从第一个 token 到本块末尾的整段前缀；
# - `BlockPool.cached_block_hash_to_block` 把哈希映射到持有这段 KV 的物理块；
# - 新请求到来时，`KVCacheManager.get_computed_blocks` 沿块哈希找出已缓存的前缀块（只查不改），scheduler 只为剩下的 token 安排计算；
# - 请求结束时块被释放，但**哈希留着**：块进入空闲队列，既是可分配的显存，也是还能命中的缓存。
#
# 所以缓存不另占显存，代价只是哈希和查表。`CacheConfig.enable_prefix_caching` 默认为 `True`。
#
# ### 2. 它如何工作
#
# 1. **块哈希链**（`hash_block_tokens`）：`hash(block_i) = H(hash(block_{i-1}), tokens_i, extra_keys_i)`，第一块的父哈希是 `NONE_HASH`。
# 2. **只哈希满块，随 token 增长**：`Request` 创建时算出所有满块的哈希，之后每次 `append_output_token_ids` 接着算新满的块。decode 的 token 也进缓存，下一轮对话能命中上一轮的回答。
# 3. **查找**（`get_computed_blocks` → `find_longest_cache_hit`）：命中上限 `max_cache_hit_length` 不含请求的最后一个 token（原因见“常见误区”）；在上限之内的满块里沿块哈希从头查表，**第一次未命中就停**；命中的 token 数按整块计（单组模型）。
# 4. **分配与登记**（`allocate_slots`）：命中的块经 `touch` 加引用，若在空闲队列里就被 O(1) 摘出；新块由 `get_new_blocks` 从空闲队列**队头**取，并用 `_maybe_evict_cached_block` 驱逐旧哈希；本步算完会满的块由 `cache_full_blocks` 立刻登记。
# 5. **释放**（`SingleTypeKVCacheManager.free`）：请求的块**逆序**交给 `BlockPool.free_blocks`。`ref_cnt` 降到 0 的块里，没有哈希的 `prepend_n` 到队头、最先复用；有哈希的 `append_n` 到队尾，队头是最久没用的（LRU）。
#
# 下图：三个共享 40 个 token system prompt 的请求（`block_size=16`）进入 minivllm 引擎，第一步后读出 `KVCacheManager.req_to_blocks` 与各块的 `ref_cnt`、哈希。

# %%
snap = L03.block_table_snapshot()
L03.print_block_table(snap)
L03.plot_block_tables(snap);

# %% [markdown]
# 图 3-1：第一步之后三个请求的块表。40 个 token 的 system prompt 占满前两个块，剩下 8 个 token 与各自的问题在第三个块里，所以只有前两个块共享（橙色，`ref_cnt=3`）。灰色斜线是不满的块：没有哈希，不能被命中。
#
# ### 3. 正确性条件与常见误区
#
# - **不变量：开启前缀缓存在数学上不改变输出。** 本课在 CPU 上检查二者一致（见真实引擎检查）。GPU 上命中与未命中的 batch 形状不同，vLLM 默认不保证 batch 不变（`VLLM_BATCH_INVARIANT` 默认关），logprob 只在浮点误差内一致，长输出的 greedy token 偶尔因近似并列而分叉。
# - **哈希必须覆盖整个前缀和块里的每个 token。** 只哈希本块时，同样的 16 个 token 换个位置就撞上同一个块，而块里的 K 带着原位置的 RoPE，从第二层起 K、V 还混入了原来的上文；漏掉一个 token 也一样。结果不是崩溃，是输出悄悄变错。
# - **extra keys 不能漏。** `extra_keys` 装“同样的 token、不同的 KV”的因素：不同 LoRA、图片、租户（`cache_salt`）下，同样的 token 对应不同的 KV，或不该被别人探测到。
# - **只有满块有哈希**（单组模型，本课）。不满的块还会被写入；给它哈希，等于承诺了一段还不存在的前缀。{{VLLM_VERSION}} 的混合模型另有例外，见附录。
# - **命中封顶在 n-1，按整块取。** 采样下一个 token 需要最后一个 token 的 logits；又因为按整块取，整块的 prompt 全部命中时要重算整个最后一块。
# - **命中必须是前缀。** 第一次未命中之后的块即使哈希还在，KV 也依赖缺失那一块的上文。
# - **复用前先驱逐旧哈希**，否则哈希表指向内容已被覆盖的块；**`ref_cnt` 降到 0 才进空闲队列**。
#
# ### 4. 性能与工程取舍
#
# - **省下 prefill 计算和重复的 KV 显存**；`block_size` 越大，n-1 封顶时重算越多。
# - **命中率取决于负载**（前缀长度、时间局部性、显存压力）。TTFT 省多少要在目标硬件上测：下面是 CPU 上的数字，GPU 上比例不同。

# %% [markdown]
# ## 具体演示：共享 system prompt 的负载，命中率与 TTFT
#
# 8 个请求共用 512 个 token 的 system prompt，各带 16 个 token 的问题，一个结束后下一个才到；在开、关前缀缓存的引擎上交替各跑 3 次。命中统计来自引擎的 `SchedulerStats`，TTFT 从 `add_request` 量到第一个 token。

# %%
runs = L03.ttft_runs()
print(L03.ttft_summary(runs))
L03.plot_hit_rate(runs);

# %% [markdown]
# 图 3-2：第 1 个请求全部未命中；从第 2 个起每个请求命中 512 个 token（32 个整块），只算 16 个。累计命中率 (N−1)·512 / (N·528)，8 个请求时约 85%。

# %%
L03.plot_ttft(runs)
print(L03.ttft_caption(runs))

# %% [markdown]
# 图 3-3：关闭缓存时每个请求 prefill 528 个 token，开启后从第 2 个起只 16 个（确定的）。TTFT 降多少看图下的实测；第 1 个请求含预热。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 补齐前缀缓存的四个决策点：块哈希里装什么、哪些块有哈希且如何成链、命中到哪里为止、新块从空闲队列的哪一端取。方法名与 vLLM 相同（`KVCacheManager.get_computed_blocks` 只返回块与命中数两项；`BlockPool.get_new_blocks`）。
#
# 只能修改 TODO/______ 位置，不得删除断言或放宽通过条件。

# %% nbgrader={"grade": false, "grade_id": "l03_prefix_cache", "locked": false, "schema_version": 3, "solution": true, "task": false}
from minivllm.core import kv_cache_utils
from minivllm.core.kv_cache_manager import KVCacheBlocks


def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
    """One full block's hash, chained to its parent (vLLM: kv_cache_utils.hash_block_tokens)."""
    if parent_block_hash is None:
        parent_block_hash = kv_cache_utils.NONE_HASH  # the first block's parent: a fixed seed
    # TODO：块的哈希要同时覆盖父块哈希、本块 token 和 extra keys。
    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)  ### BLANK
    return hash_function(key)


def request_block_hasher(request, block_size=16, hash_function=hash):
    """Hashes of the request's newly full blocks, chained onto request.block_hashes."""
    parent_hash = request.block_hashes[-1] if request.block_hashes else None
    # TODO：哪些块有哈希？新哈希链在谁后面？
    num_full_blocks = request.num_tokens // block_size  ### BLANK
    new_hashes = []
    for i in range(len(request.block_hashes), num_full_blocks):
        block_tokens = request.all_token_ids[i * block_size:(i + 1) * block_size]
        parent_hash = hash_block_tokens(hash_function, parent_hash, block_tokens)  ### BLANK
        new_hashes.append(parent_hash)
    return new_hashes


def get_computed_blocks(self, request):
    """KVCacheManager.get_computed_blocks: the longest run of cached full blocks from the start."""
    if not self.enable_caching:
        return KVCacheBlocks([]), 0
    # TODO：命中最多到哪里？命中的 token 数是多少？
    max_cache_hit_length = request.num_tokens - 1  ### BLANK
    computed_blocks = []
    for block_hash in request.block_hashes[:max_cache_hit_length // self.block_size]:
        block = self.block_pool.get_cached_block(block_hash)
        if block is None:
            break  # the chain breaks at the first miss
        computed_blocks.append(block)
    num_computed_tokens = len(computed_blocks) * self.block_size  ### BLANK
    return KVCacheBlocks(computed_blocks), num_computed_tokens


def get_new_blocks(self, num_blocks):
    """BlockPool.get_new_blocks: reuse free blocks, evicting any stale cached hash they still carry."""
    # TODO：从空闲队列的哪一端取块？
    blocks = self.free_block_queue.popleft_n(num_blocks)  ### BLANK
    for block in blocks:
        if block.block_hash is not None:
            self._maybe_evict_cached_block(block)  # its old KV is about to be overwritten
        assert block.ref_cnt == 0, block
        block.ref_cnt = 1
    return blocks


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson03", globals())

# %% [markdown]
# 下面的断言来自 vLLM `tests/v1/core/test_prefix_caching.py` 的 `test_prefill`（单组 API）。`L03.make_manager` 建一个 minivllm 的 `KVCacheManager`（11 个块，块 0 是 null block）并换上你的两个方法。

# %% nbgrader={"grade": true, "grade_id": "l03_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
common = [i for i in range(3) for _ in range(16)]  # 3 full blocks, 48 tokens
manager = L03.make_manager(11, get_computed_blocks, get_new_blocks)

req0 = L03.make_request("0", common + [3] * 7, request_block_hasher)  # 3 full blocks + 7 tokens
assert len(req0.block_hashes) == 3
computed, n = manager.get_computed_blocks(req0)
assert computed.blocks == [] and n == 0
assert manager.allocate_slots(req0, 55, n, computed).get_block_ids() == [1, 2, 3, 4]

req1 = L03.make_request("1", common + [3] * 5, request_block_hasher)  # the same prefix + 5 tokens
computed, n = manager.get_computed_blocks(req1)
assert computed.get_block_ids() == [1, 2, 3] and n == 48
assert manager.allocate_slots(req1, 53 - 48, n, computed).get_block_ids() == [5]
assert [b.ref_cnt for b in computed.blocks] == [2, 2, 2]
### BEGIN HIDDEN TESTS
L03.check_main_path(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查把你的四个函数接进真实的 minivllm `EngineCore`（`L03.plugged`），跑四个负载；命中统计等于 minivllm 自己的实现，每个请求的 token 要等于关闭缓存时的结果、logprob 差小于 1e-3：
#
# 1. **共享前缀**：8 个请求，system prompt 是 `X + X`，其中一个请求就是它本身，全部命中、封顶；
# 2. **驱逐顺序**（vLLM `test_evict`）：两个请求结束后空闲队列应是 `[6, 10, 5, 4, 3, 2, 1, 9, 8, 7]`；
# 3. **一步失败**：丢哈希的块不挪位，仍取队头；
# 4. **驱逐压力**：9 个可用块、6 个请求，其中一个是多轮对话的下一轮，命中上一轮生成的 token。

# %% nbgrader={"grade": true, "grade_id": "l03_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
engine_runs = L03.check_real_engine(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks)
batch = engine_runs["batch"]
print(f"共享前缀：命中 {batch.hits}/{batch.queries} 个 token，每个请求命中 {batch.cached}；输出与关闭缓存时一致。")
print("驱逐顺序：", engine_runs["eviction"].free_order, "→ 新块", engine_runs["eviction"].new_block_ids[-1])

# %% [markdown]
# ## 检查方法
#
# 运行断言；再把同一个恰好 3 个满块（48 个 token）的 prompt 提交两次，读下面的输出：第二次命中多少个 token、本步算多少个、块表是什么？Q2 问其中的原因。

# %%
demo = L03.full_hit_demo(request_block_hasher, get_computed_blocks, get_new_blocks)
print(demo)

# %% nbgrader={"grade": true, "grade_id": "l03_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
manager = L03.make_manager(11, get_computed_blocks, get_new_blocks)
full = L03.make_request("full", common, request_block_hasher)  # exactly 3 full blocks
manager.allocate_slots(full, 48)
computed, n = manager.get_computed_blocks(L03.make_request("again", common, request_block_hasher))
assert computed.get_block_ids() == [1, 2] and n == 32  # capped at 47 tokens: the last block is recomputed
short = L03.make_request("short", [5] * 15, request_block_hasher)
assert short.block_hashes == [] and manager.get_computed_blocks(short)[1] == 0
same = L03.make_request("same", [7] * 32 + [1], request_block_hasher)
assert len(set(same.block_hashes)) == 2  # the same 16 tokens at two positions: two hashes
### BEGIN HIDDEN TESTS
L03.check_boundary(hash_block_tokens, request_block_hasher, get_computed_blocks, get_new_blocks)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# “能映射回源码对象”（1 分）在这里自动评分。照位置提示找到每一项的名字，写成字符串（可带类名或 `self.`，参数可省略）；前三项在上面打印的摘录里：
#
# - `lookup_gate`：`get_computed_blocks`（L250）里决定这个请求查不查前缀缓存的 `KVCacheManager` 方法；
# - `evict_hashes`：`_maybe_evict_cached_block`（L694）里把块的哈希从缓存表里摘掉的 `BlockPool` 方法；
# - `null_flag`：`free_blocks`（L732）里不让 null block 进空闲队列所查的 `KVCacheBlock` 字段；
# - `free_link`：`kv_cache_utils.py` 的 `class KVCacheBlock` 里，空闲队列这条双向链表指向下一个块的字段；
# - `hashed_count`：`SingleTypeKVCacheManager.free` 调用的 `pop_blocks_for_free`（就在它上方）里，和块表一起按请求弹出的“已缓存几个满块”的 dict。

# %% nbgrader={"grade": false, "grade_id": "l03_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "lookup_gate": "prefix_cache_lookup_enabled",  ### BLANK
    "evict_hashes": "_remove_cached_block_hashes",  ### BLANK
    "null_flag": "is_null",  ### BLANK
    "free_link": "next_free_block",  ### BLANK
    "hashed_count": "num_cached_block",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l03_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L03.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l03_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 如果 `hash_block_tokens` 只哈希本块的 token、不带父块的哈希，本课真实引擎检查的“共享前缀”负载（system prompt 是 `X + X`，第 3、4 块与第 1、2 块 token 相同）会出什么错？为什么？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清后果与原因：不带父哈希时，第 3、4 块与第 1、2 块同哈希 → 后来的请求查表会把一个位置的块当成另一个位置的块命中（例如位置 32–63 用上位置 0–31 算出的 KV；K 带着原位置的 RoPE，KV 依赖的上文也不同）→ 输出（token 或 logprob）与关闭缓存时不同，而且不报错；带父哈希时块哈希代表从开头到本块末尾的整段前缀，哈希相等才意味着 KV 可以复用。1 分 = 只说“哈希碰撞 / 命中错的块”而没有落到 KV 内容与输出；或只讲链式哈希的原理，没说这个负载的后果。0 分 = 用性能优化或去重代替正确性来解释父哈希（混淆正确性与性能，一票否决）；说清正确性之后再提“查表一次就比较了整段前缀”的效率不扣分。
#
# **参考答案**
#
# 块里存的是这 16 个 token 在这段上文之后、这些位置上的 K/V：K 乘过对应位置的 RoPE，更深层的 K/V 还混入了前面所有 token 的信息。只哈希本块时，`X + X` 的第 3、4 块与第 1、2 块 token 相同、哈希相同，同一个哈希下登记着两个不同位置的物理块；后来的请求在 `get_computed_blocks` 里沿哈希查表，会把一个位置的块挂到另一个位置上，例如位置 32–63 读到位置 0–31 的 KV。于是 logprob 与关闭缓存时不同，生成的 token 也可能变；引擎不报错，输出悄悄变错。`hash(block_i) = H(hash(block_{i-1}), tokens_i, extra_keys_i)` 让块 i 的哈希相等等价于前 i 块的 token 全部相等，查表一次就比较了整段前缀。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l03_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# 检查方法里，恰好 3 个满块（48 个 token）的 prompt 已全部在缓存里，第二次提交却只命中 32 个 token。为什么不是 48 个，也不是 47 个？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **不是 48（1 分）**：采样下一个 token 要用最后一个 token 的 logits，logits 只在本步被调度计算的 token 上产生；全部命中时本步要算的 token 为 0，没有 logits（minivllm 的调度器会断言失败；不然首 token 出错）→ 所以上限是 `num_tokens - 1` = 47。
# - **不是 47（1 分）**：命中只按整块算（`find_longest_cache_hit` 只看前 `max_length // block_size` = 2 个块；`allocate_slots` 要求 `num_computed_tokens` 按块对齐）→ 命中 2 块 = 32 个 token，第 3 块的 16 个 token 全部重算，写进一个新块。
# - 0 分：认为封顶是为了省显存或提高命中率（混淆正确性与性能，一票否决）。
#
# **参考答案**
#
# 命中等于把这些 token 记为已计算。若命中全部 48 个，scheduler 算出的 `num_new_tokens` 是 0，本步不为这个请求做 forward，也就没有最后一个 token 的 logits 可以采样；所以 `get_computed_blocks` 把上限设为 `request.num_tokens - 1`（L259），最后一个 token 必须重算。命中又只能是整块：`find_longest_cache_hit` 只沿前 47 // 16 = 2 个块哈希查表，`allocate_slots` 也要求命中数按块对齐，于是命中 32 个 token，本步重算 16 个。代价最多一整块的 prefill，是为正确性付的性能代价（L253–L258 的 NOTE 也承认以后可以优化）。
#
# **附：检查方法输出的读法**（不计分）：第二次提交命中 `[1, 2]`、32 个 token，本步算 16 个；块表 `[1, 2, 4]`：块 1、2 共享（`ref_cnt=2`），第三块重算进新块 4（块 3 正被第一个请求持有），写完后块 4 与块 3 同哈希，两个块都登记在这个哈希下（`BlockHashToBlockMap` 不去重）。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l03_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# `SingleTypeKVCacheManager.free`（L526–L527）为什么把请求的块**逆序**交给 `BlockPool.free_blocks`？从驱逐顺序和之后的命中两方面说明。
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**：2 分 = 说清：空闲队列是 LRU，`get_new_blocks` 从队头取块并驱逐它的哈希，有哈希的块按释放顺序 `append_n` 到队尾；一个请求的块同时释放，逆序让链尾排在前面、链头（最可能被别的请求共享的公共前缀）排在最后 → 驱逐从链的末端往前削 → 留在缓存里的块始终是一段前缀 → 查找在第一次未命中处停下，这段前缀仍能被命中。（若顺序释放，链头先被驱逐，后面的块哈希还在表里却再也命中不到，白占位置。）1 分 = 只说出 “队头先驱逐、链尾先被驱逐”，没推到 “幸存的是前缀、仍能命中”；或只说保住前缀，没有驱逐顺序的机制。0 分 = 认为逆序是为了速度，或说队尾先被驱逐。
#
# **参考答案**
#
# `free_blocks` 的 docstring 说传入的块按驱逐优先级排列、第一个最先被驱逐：`ref_cnt` 降到 0、有哈希的块 `append_n` 到队尾，`get_new_blocks` 用 `popleft_n` 从队头取块并 `_maybe_evict_cached_block`。一个请求结束时它的块同时变空闲，队列里它们的先后只由传入顺序决定；`reversed(...)` 让链尾先进队列、链头最后进。链尾块的哈希依赖整段前缀，最不可能被别的请求命中；链头（如 system prompt 的开头）被最多请求共享。于是驱逐总是先削掉链尾，缓存里剩下的始终是某段前缀，而 `find_longest_cache_hit` 在第一次未命中处停下，正好还能命中这段前缀。顺序释放则先驱逐链头，后面的块哈希虽在、却再也命中不到。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（vLLM 场景 1 分、真实 EngineCore 1 分）、边界条件 1 分、映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
#
# 总分 10 分，至少 8 分通过。参考答案只在教师分支（solutions/）中：先独立完成；核对后换一个 batch、cache 或硬件条件重新推演，不能只复制。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分，Q1～Q3 显示为待人工评分。

# %%
self_check("lesson03", globals());

# %% [markdown]
# ← 上一课：第 2 课

# %% [markdown]
# ## 附录（选读）
#
# 不计分，可以跳过：在真实 vLLM 上对照、两个细节、参考资料与差异清单。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 把 vLLM 测试的 `test_prefill`、`test_evict` 交给 vLLM {{VLLM_VERSION}} 自己的 `KVCacheManager`、`BlockPool` 和哈希器（sha256），与 minivllm 逐个操作对照。哈希值两边不同，表里按首次出现编号，相等关系须一致。
#
# 主路径与边界两项评分也跑这两个场景和另外九个（`autograder/lesson03/vllm_view.py`）：你的函数接进 minivllm 后，每个操作都要与 vLLM 录下的相同。

# %%
L03.vllm_side_by_side()

# %% [markdown]
# ### 两个细节
#
# - **同一步里命中是安全的**：图 3-1 的三个请求在同一次 `schedule()` 里被接纳，r0 的 `allocate_slots` 立刻登记满块，r1、r2 随即命中；每一层都先把本步所有 token 的 K/V 写进缓存，再做 attention。
# - **登记不去重**：两个物理块可以以同一个哈希登记，命中时取其中任意一个；驱逐只摘掉一个块（`BlockHashToBlockMap.pop(key, block_id)`）。已交给请求的块号不能再换，块表因此只追加（见 `BlockHashToBlockMap` 的 NOTE）。关闭缓存时释放的块全部追加到队尾。
#
# ### 参考资料
#
# - [vLLM kv_cache_utils.py：块哈希、空闲队列](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/kv_cache_utils.py)
# - [vLLM block_pool.py：BlockPool](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/block_pool.py)
# - [vLLM kv_cache_manager.py：get_computed_blocks、allocate_slots](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/kv_cache_manager.py)
# - [vLLM single_type_kv_cache_manager.py：find_longest_cache_hit、free](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/core/single_type_kv_cache_manager.py)
# - [vLLM tests/v1/core/test_prefix_caching.py：test_prefill、test_evict](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/tests/v1/core/test_prefix_caching.py)
# - [vLLM Automatic Prefix Caching design（current docs）](https://docs.vllm.ai/en/latest/design/prefix_caching/)
#
# 源码链接固定到本课对照的 commit；current docs、默认参数与命中粒度会变化，部署前按目标版本重新核对。
#
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# 本课评分的机制与 vLLM 相同：链式哈希、n-1 封顶、按整块命中、LRU 队列、逆序释放、无哈希块放队头。其余差别：
#
# - **KV-cache 组**：vLLM 的哈希表以 `BlockHashWithGroupId`（块哈希加组号）为键，查找经 `KVCacheCoordinator` 交给每组的 `find_longest_cache_hit`；minivllm 只有一个全注意力组，键就是块哈希，块表是一维列表。
# - **返回值**：vLLM 的 `get_computed_blocks` 返回 `(块, 命中 token 数, shared_prefix_boundary)`，第三项供滑动窗口、Mamba 等组使用；minivllm 只返回前两项。
# - **命中粒度**：单组时 `resolve_kv_cache_block_sizes` 让哈希粒度等于 `block_size`；多组（混合模型）时取 `CacheConfig.prefix_match_unit`，默认各组块大小的最大公约数，可能小于 `block_size`。课程的模型都是单组，只有满块有哈希、命中按整块。
# - **混合模型的块内命中**：哈希粒度小于 `block_size` 时，`find_longest_cache_hit` 的 Phase 2 可命中到块内，`_cache_partial_tail_block` 给 prompt 末尾不满的块登记哈希；命中者要接着写这个块时先复制一份（copy-on-write）。
# - **extra keys**：vLLM 的 `get_request_block_hasher` 对每个新满块都调用 `generate_block_hash_extra_keys`，算出 LoRA、多模态、`cache_salt`（只进第一块）、prompt embeds 的键，都没有时返回 `None`；minivllm 没有这些功能，练习的哈希器不传 extra keys。
# - **跳过查找**：请求 prompt logprobs 的请求（`skip_reading_prefix_cache` 因此默认为真）和全量 pooling 请求，vLLM 不查缓存、也不计入统计；minivllm 没有 prompt logprobs，开启缓存时总是查。
# - **哈希函数**：vLLM 默认 `prefix_caching_hash_algo="sha256"`，即 pickle 后做 SHA-256，另有 `sha256_cbor`、`xxhash`、`xxhash_cbor`；minivllm 默认用 Python 内建 `hash`，也提供 `sha256`。
# - **`NONE_HASH`**：vLLM 的 `init_none_hash` 在设置了 `PYTHONHASHSEED` 时由它决定，否则每个进程随机（`os.urandom(32)`）；minivllm 导入时固定用种子 0，结果可复现。
# - **统计**：两边都在请求被接纳时记一次查询，被抢占后恢复的请求记进 `preempted_*`。vLLM 的 `make_prefix_cache_stats` 每读一次就清零，日志里的命中率是最近 1,000 个请求的窗口（`CachingMetrics`）；minivllm 一直累计到 `reset_prefix_cache`。

