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
# # 第 8 课：结构化输出：grammar bitmask 与 CPU/GPU 重叠
#
# ## 本课目标与通过标准
#
# 本课产出：为 `choice` 约束亲手写出与 xgrammar 逐位相同的 bitmask，并说清一个受约束请求从进入引擎到每一步采样的路径：
#
# - grammar 在哪里编译，请求为什么要在 `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` 等待；
# - 每步的 token bitmask 由谁、在什么时候算；
# - 它在 runner 的哪一步作用到 logits 上；
# - 采样出的 token 又由谁推进 grammar。
#
# 通过要求：代码断言全部通过；Q1～Q3 沿源码对象给出因果链；总分至少 8/10。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（与 xgrammar、vLLM {{VLLM_VERSION}} 的 bitmask 逐字相同 1 分 + 接入真实引擎 1 分） | 2 | 自动 |
# | 代码·边界条件（EOS 只在文本等于某个选项时允许、mask 先于采样） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时，运行最后的“自检”单元格（或 `python -m autograder check lesson08`）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 源码固定在 vLLM {{VLLM_VERSION}}（commit {{VLLM_COMMIT}}）。先画出“编译 → 等待 → 每步 bitmask → 采样前屏蔽 → 推进状态”这条线，再读下面四段。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `v1/structured_output/__init__.py`：`StructuredOutputManager.grammar_init`（L166–L175） | `minivllm/structured_output/__init__.py` | 编译为什么放进线程池？ |
# | 2 | `v1/core/sched/scheduler.py`：`Scheduler._try_promote_blocked_waiting_request`（L2695–L2704）、`update_from_output`（L1954–L1962） | `minivllm/core/sched/scheduler.py` | 谁把请求从等待编译放行？编译失败呢？ |
# | 3 | `v1/engine/core.py`：`EngineCore.step`（L584–L614） | `minivllm/engine/core.py`：`EngineCore.step` | bitmask 在发射 forward 与等待它之间计算，重叠了什么？ |
# | 4 | `v1/worker/gpu/structured_outputs.py`：`StructuredOutputsWorker.apply_grammar_bitmask`（L39–L48） | `minivllm/structured_output/utils.py` | bitmask 的行顺序怎样变成 logits 的行顺序？ |
#
# > **哪个 runner**：第 4 行属于 Model Runner V2（{{VLLM_VERSION}} 上 dense 模型的默认）；V1 runner 的做法见附录。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/structured_output/__init__.py", "StructuredOutputManager.grammar_init", lines=(166, 175))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler._try_promote_blocked_waiting_request", lines=(2695, 2704))
show_vllm("vllm/v1/core/sched/scheduler.py", "Scheduler.update_from_output", lines=(1954, 1962))
show_vllm("vllm/v1/engine/core.py", "EngineCore.step")
show_vllm("vllm/v1/worker/gpu/structured_outputs.py", "StructuredOutputsWorker.apply_grammar_bitmask", lines=(39, 48))

# %% nbgrader={"grade": false, "grade_id": "l08_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr），导入本课的演示与检查。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

import torch  # noqa: E402

from autograder import lesson08 as L08  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson08")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

VOCAB = L08.default_vocab()  # 默认模型的每个 token 的字节（特殊 token 为 b""）、EOS id、logits 宽度与 TokenTrie

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# 结构化输出让模型的输出必定满足一个形式约束：JSON schema、正则、几个候选字符串之一（`choice`）或一段 EBNF 文法。做法不是生成完再校验、失败重试，而是在**每一步采样之前**把不可能通向合法输出的 token 的 logit 设为 $-\infty$。
#
# vLLM 默认（`backend = "auto"`）先用 xgrammar，约束不被支持时才退回 guidance 或 outlines。
#
# 被屏蔽的集合每步都变，所以每步要为每个受约束请求算一行 **token bitmask**：`int32` 数组，形状 `[请求数, ceil(vocab/32)]`。第 $w$ 个字的第 $j$ 位为 1，表示 token $32w+j$ 允许出现；第 31 位为 1 时这个 int32 是负数，这只是补码的读法。
#
# ### 2. 它如何工作
#
# 一个受约束请求的一生：
#
# 1. **编译**：`StructuredOutputManager.grammar_init` 把编译提交到线程池，请求拿到一个 Future，状态是 `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`。
# 2. **放行**：`schedule()` 遍历等待队列时只“看一眼” Future：编好了就改成 `WAITING` 参与调度；没编好就跳过它，其他请求照常运行；编译失败的请求记下来，在下一次 `update_from_output` 里以 `FINISHED_ERROR` 结束。
# 3. **每步 bitmask**：`EngineCore.step` 在 `execute_model(non_block=True)` 之后、`future.result()` 之前调用 `scheduler.get_grammar_bitmask`，为本步要采样的受约束请求填 bitmask，与 forward 重叠。
#
#    runner 在 forward 后返回 None，EngineCore 再把 bitmask 交给 `sample_tokens(grammar_output)`。默认的异步调度改走 `step_with_batch_queue`，decode 的 bitmask 要等上一步的输出（见附录）。
# 4. **采样前屏蔽**：bitmask 的行按调度顺序，logits 的行按批内顺序。runner 按请求 id 找到每个请求的 logits 行，含草稿位置，把禁止的 token 置为 $-\infty$，然后才采样。
#
#    投机解码时每个草稿位置和 bonus 位置各一行：沿草稿逐个 `accept_tokens` 填行，填完 `rollback`；不合 grammar 的草稿在调度器收到时已被 `validate_tokens` 截掉。
# 5. **推进状态**：`update_from_output` 先做停止判断，再把采样出的 token 交给该请求的 `accept_tokens`。请求因 EOS 等停止条件结束，不是因为 grammar 终止；grammar 终止后，它的 bitmask 行是全 1。
#
# 下面先看一行 bitmask 到底是什么：选项是 `["yes", "no", "perchance"]`，已经生成了 `"per"`。

# %%
print("允许的下一个 token：", L08.allowed_next("per", ["yes", "no", "perchance"]))
L08.show_words("per", ["yes", "no", "perchance"])  # 只印前 4 个含允许 token 的字（int32）

# %% [markdown]
# 允许的正是字节串为剩余部分 `"chance"` 的**前缀**的那些 token：`c`、`ch`、`chan`……BPE 可以用许多种切分拼出同一个字符串，约束只关心字节，不关心切分。只看首字符是错的：`"cat"` 的首字符 `c` 合法，但拼出的 `"percat"` 不再是任何选项的前缀。
#
# 用一棵 **TokenTrie**，即所有 token 的字节组成的字典树，可以一次走完：沿剩余字节 `"chance"` 向下走，途中经过的每个“token 结束”节点都是一个允许的 token。代价是剩余字节的长度，不是词表大小。
#
# > **minivllm ≠ vLLM**：字典树是本课为 `choice` 写的做法。vLLM 把 `choice` 转成 EBNF 交给 xgrammar 编译；本课模型上两者的 bitmask 逐字相同。
#
# ### 3. 正确性条件与常见误区
#
# - **先屏蔽后采样，行按请求 id 对齐**：采样看到的禁止 token 必须已是 $-\infty$；行错位时，一个请求会被另一个请求的约束屏蔽。
# - **EOS 只在完成时允许**：已生成的字节恰好等于某个选项时才放行 EOS；若它同时是更长选项的前缀（`no` 与 `none`），EOS 和继续生成都允许。只是以某个选项结尾不算：选项是 `nonce` 与 `on` 时，已生成的 `non` 不能结束。
# - **位序**：第 $j$ 位从最低位数起；位序反了，允许集合就整体错位。
# - **不受约束的请求不受影响**：vLLM 的 bitmask 没有它们的行（V1 runner 与 minivllm 重排时补全 1 行），logits 不被改动；本课 CPU 上同批输出与单独运行逐 token 相同。
#
# ### 4. 性能与工程取舍
#
# - **编译延迟**：JSON schema 的编译可能要毫秒到秒级。放进线程池，调用 `grammar_init` 的线程（vLLM 是输入线程，minivllm 是 busy loop）不被占住；代价是该请求的首 token 晚到。
# - **每步 bitmask 的 CPU 时间**：本机 4096 词表每步中位数几十微秒（下面的 trace）。落在 forward 之内时几乎免费；forward 更短时它就露出来，拖慢每一步（`benchmarks/structured_output.py` 量吞吐）。
# - **重叠从哪里来**：vLLM 的 `UniProcExecutor` 在调用线程里同步执行、返回已完成的 Future，重叠来自 GPU kernel 的异步执行；CPU 上单进程跑 vLLM 没有这种重叠。
# - **minivllm ≠ vLLM**：minivllm 的 `UniProcExecutor` 把 `execute_model` 交给一个 worker 线程（torch 算子释放 GIL），CPU 上 forward 与 bitmask 填充真的并行。

# %% [markdown]
# ## 具体演示：同批的受约束请求与自由请求
#
# 在真实的 minivllm `EngineCore` 上，先单独跑 5 个自由的贪心请求，再把它们与 5 个 `choice` 请求放进同一批；`choice` 请求有贪心也有带种子的随机采样，选项各不相同。受约束输出必须是选项之一，自由请求必须与单独运行逐 token 相同。
#
# trace 画出几步的时间线：红色的 grammar 阶段在 execute 发射之后开始，在 worker 的 forward（橙色）结束之前完成。bitmask 个别步要几毫秒。

# %%
demo = L08.run_demo()
L08.print_outputs(demo)
g = L08.grammar_steps(demo.events)
print(f"{g['steps']} 步需要 bitmask，其中 {g['before_forward_end']} 步的 grammar 在 forward 结束之前完成；"
      f"本次运行 grammar 每步中位数 {g['median_us']:.0f} µs、最长 {g['max_us'] / 1e3:.2f} ms（墙钟，随机器负载变化）")
L08.plot_overlap(demo.events);

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 实现 `choice` 约束的 bitmask（不得使用 xgrammar）和“先屏蔽、再采样”：
#
# - `choice_bitmask(batch_req_ids, generated, choices, trie, eos_token_id, vocab_size)`：返回 `torch.int32`，形状 `[len(batch_req_ids), ceil(vocab_size/32)]`。
#   - `generated[req_id]` 是该请求已生成的字节，`choices[req_id]` 是它的选项；这两个字典的键按调度顺序，**行必须按 `batch_req_ids`**。
#   - `trie.prefixes_of(rest)` 返回字节串为 `rest` 的非空前缀的所有 token。
# - `apply_bitmask_and_sample(logits, bitmask, sample)`：把不允许的 token 置为 $-\infty$，然后调用 `sample`。
#
# 只改 `______` 处，不删断言、不放宽条件。

# %% nbgrader={"grade": false, "grade_id": "l08_choice_bitmask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def choice_bitmask(batch_req_ids, generated, choices, trie, eos_token_id, vocab_size):
    words = torch.zeros(len(batch_req_ids), (vocab_size + 31) // 32, dtype=torch.int64)
    # TODO：行的顺序；剩余字节；何时允许 EOS；token -> (字, 位)。
    rows = batch_req_ids  ### BLANK
    for row, req_id in enumerate(rows):
        done = generated[req_id]
        allowed = set()
        for choice in choices[req_id]:
            if choice.startswith(done):
                rest = choice[len(done):]  ### BLANK
                allowed.update(trie.prefixes_of(rest))
        eos_allowed = done in choices[req_id]  ### BLANK
        if eos_allowed:
            allowed.add(eos_token_id)
        for token in allowed:
            word, bit = token // 32, token % 32  ### BLANK
            words[row, word] |= 1 << bit
    return words.to(torch.int32)  # 第 31 位回绕成符号位：与 xgrammar 存的 32 位相同


def apply_bitmask_and_sample(logits, bitmask, sample):
    bits = (bitmask.to(torch.int64)[:, :, None] >> torch.arange(32)) & 1
    allowed = bits.flatten(1)[:, :logits.shape[-1]].bool()
    # TODO：先屏蔽，再采样。
    masked = logits.masked_fill(~allowed, float("-inf"))  ### BLANK
    return sample(masked)  ### BLANK


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson08", globals())

# %% nbgrader={"grade": true, "grade_id": "l08_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
trie = VOCAB.trie
mask = choice_bitmask(["b", "a"], {"a": b"per", "b": b""}, {"a": [b"yes", b"perchance"], "b": [b"no"]},
                      trie, VOCAB.eos_token_id, VOCAB.vocab_size)
assert mask.dtype == torch.int32 and tuple(mask.shape) == (2, (VOCAB.vocab_size + 31) // 32)
allowed = L08.unpack(mask, VOCAB.vocab_size)
assert sorted(allowed[1].nonzero().flatten().tolist()) == sorted(trie.prefixes_of(b"chance"))  # 行 1 是 "a"
assert sorted(allowed[0].nonzero().flatten().tolist()) == sorted(trie.prefixes_of(b"no"))
assert torch.equal(mask, L08.xgrammar_choice_bitmask(["b", "a"], {"a": b"per", "b": b""},
                                                     {"a": [b"yes", b"perchance"], "b": [b"no"]}, VOCAB))
### BEGIN HIDDEN TESTS
L08.check_choice_bitmask(choice_bitmask)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查：把你的 `choice_bitmask` 接入真实的 minivllm，替换 `StructuredOutputManager.grammar_bitmask` 的填充。编译、等待与 xgrammar 的 `accept_tokens` 仍是引擎自己的，你放行的每个 token 都要被真正的 grammar 接受。
#
# 重放上面的演示：受约束输出都是选项之一，自由请求不变，grammar 阶段与 forward 重叠。

# %% nbgrader={"grade": true, "grade_id": "l08_real_engine", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
student_run = L08.check_real_engine(choice_bitmask)
print("真实引擎检查通过：输出都是选项之一；自由请求不变；grammar 与 forward 重叠。")

# %% [markdown]
# ## 检查方法
#
# 选项是 `["no", "none"]`，已经生成了 `"no"`：这时 EOS 允许吗？继续生成呢？再把 `apply_bitmask_and_sample` 里的两行对调，先采样、后屏蔽，看看 `sample` 收到的 logits 有什么不同，并解释为什么结果在贪心时“有时仍然对”。

# %%
row = L08.unpack(choice_bitmask(["r"], {"r": b"no"}, {"r": [b"no", b"none"]}, VOCAB.trie, VOCAB.eos_token_id,
                                VOCAB.vocab_size), VOCAB.vocab_size)[0]
print("EOS 允许：", bool(row[VOCAB.eos_token_id]), "；其他允许的 token：",
      [VOCAB.token_bytes[t] for t in row.nonzero().flatten().tolist() if t != VOCAB.eos_token_id])
logits, bitmask = L08.masked_logits_example()
print(apply_bitmask_and_sample(logits, bitmask, lambda x: x.argmax(dim=-1)))

# %% [markdown]
# 你的解释（不计分）：

# %% nbgrader={"grade": true, "grade_id": "l08_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
done_no = L08.unpack(choice_bitmask(["r"], {"r": b"no"}, {"r": [b"no", b"none"]}, VOCAB.trie, VOCAB.eos_token_id,
                                    VOCAB.vocab_size), VOCAB.vocab_size)[0]
assert bool(done_no[VOCAB.eos_token_id]) and len(done_no.nonzero()) > 1
logits, bitmask = L08.masked_logits_example()
assert apply_bitmask_and_sample(logits, bitmask, lambda x: x.argmax(dim=-1)).tolist()[0] in (5, 9)
### BEGIN HIDDEN TESTS
L08.check_boundary(choice_bitmask, apply_bitmask_and_sample)
### END HIDDEN TESTS

# %% [markdown]
# ## 映射回源码对象
#
# 写出每个键在 vLLM 中对应的名字（括号里是 `v1/structured_output/` 下的文件），可带对象前缀与括号：
#
# - `escape`（`utils.py`）：`choice_as_grammar` 把每个选项写进 EBNF 字符串字面量之前，给引号和反斜杠加转义的函数；
# - `parallel_fill`（`__init__.py`）：受约束的请求多于阈值时，`StructuredOutputManager` 把一块块 bitmask 提交到线程池的方法；
# - `terminated`（`backend_types.py`）：grammar 接口（`StructuredOutputGrammar`）里判断 matcher 已走到终止状态、不必再填 bitmask 的方法；
# - `ready`（`request.py`）：`StructuredOutputRequest` 里查看编译 Future 是否完成的方法，最多等 100 µs。

# %% nbgrader={"grade": false, "grade_id": "l08_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "escape": "escape_ebnf_string",  ### BLANK
    "parallel_fill": "StructuredOutputManager._async_submit_fill_bitmask",  ### BLANK
    "terminated": "grammar.is_terminated",  ### BLANK
    "ready": "StructuredOutputRequest._check_grammar_completion",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l08_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L08.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l08_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 为什么 vLLM 在 `execute_model(non_block=True)` 之后、等待 forward 之前计算 bitmask，而不是在 `schedule()` 里或 forward 之后？minivllm 在 CPU 上、vLLM 在 GPU 上，这种重叠各靠什么成立？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分）：
#
# - **为什么是这个窗口（1 分）**：bitmask 要按本步 `schedule()` 的结果填（哪些受约束请求、各带几个草稿），又必须在 `sample_tokens` 之前交给 runner；放在非阻塞发射与 `future.result()` 之间，CPU 填 bitmask 与 forward 同时进行，只要它不比 forward 慢就不增加每步时长。放进 `schedule()` 或 forward 之后都是串行加在关键路径上。注意：同步调度下 matcher 状态在 `schedule()` 之前就已由上一步 `update_from_output` 推进好，所以“matcher 状态没准备好”不是不放进 `schedule()` 的理由；只以它作答、没有成本链的，这 1 分不给。指出异步调度下上一步的 token 还在路上（`pending_structured_output_tokens`，bitmask 推迟）的，是对的。
# - **重叠各靠什么（1 分）**：两个系统都说对：minivllm 在 CPU 上靠 `UniProcExecutor` 的 worker 线程跑 forward、torch 的算子释放 GIL；vLLM 的 `UniProcExecutor` 在调用线程里同步执行 `execute_model`、返回已完成的 `Future`，重叠来自 GPU 上 CUDA kernel 的异步执行（发射即返回，CPU 接着填 bitmask）。只说对其中一个系统的，这 1 分不给；说“vLLM 的 forward 在 UniProcExecutor 的 worker 线程里跑”不得这一点。写出“CPU 上单进程跑 vLLM 没有这种重叠”的是对的，不要求。
# - 0 分：认为重叠是正确性的来源，或认为 bitmask 可以晚于采样（一票否决）。
#
# **参考答案**
#
# 1. 依赖：第 $t$ 步的 bitmask 按本步调度出的受约束请求（及其草稿）逐行填，由每个请求的 `GrammarMatcher` 状态决定；这个状态在第 $t-1$ 步的 `update_from_output` → `accept_tokens` 里推进，同步调度下在本步 `schedule()` 之前就已就绪。采样（`sample_tokens`）又必须先拿到 bitmask。所以窗口是“本步 schedule 之后、本步采样之前”；放在哪里是成本问题。
# 2. 成本：forward 是本步最长的阶段。`EngineCore.step` 先 `execute_model(non_block=True)` 把 forward 交给 worker，立刻在 EngineCore 线程调用 `scheduler.get_grammar_bitmask`，再 `future.result()`；runner 在 forward 后返回 None（vLLM 每步如此；minivllm 只在 `has_structured_output_requests` 时），EngineCore 再调 `sample_tokens(grammar_output)`。bitmask 的 CPU 时间因此藏在 forward 里：半数请求受约束时每步只多一次线程往返。
# 3. 重叠靠什么：minivllm 在 CPU 上把 forward 放在 `UniProcExecutor` 的 worker 线程里执行，torch 的算子在 C++ 里释放 GIL，EngineCore 线程的 Python 代码与 xgrammar 的填充可以真正并行（本课 trace 中红色 grammar 落在橙色 forward 之内）——这个线程是 minivllm 的。vLLM 的 `UniProcExecutor` 在调用线程里同步执行 worker 的 `execute_model`，返回一个已完成的 `Future`；在 GPU 上，`execute_model` 只是发射 kernel，kernel 异步执行，CPU 随即填 bitmask，二者重叠；默认的异步调度下，decode 时受约束请求的上一步 token 总还在路上（`pending_structured_output_tokens`），所以 bitmask 与采样每步都推迟到上一步的输出处理之后，这时本步的 forward 已在 GPU 上运行。放进 `schedule()` 会把它串行地加到每步的关键路径上；放到 forward 之后同样是串行。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l08_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# grammar 的编译延迟会带来什么代价？`WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR` 怎样把它藏起来，又没藏住什么？
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分：2 分 = 两部分都给出因果链；1 分 = 只有其中一部分；0 分 = 都没有）：
#
# - **代价与没藏住的（1 分）**：编译（与分词器词表有关，JSON schema 可达毫秒到秒级）若在 busy loop 里同步进行，整批请求都要停顿；交给线程池之后，没藏住的是这个请求自己的首 token 延迟：编好之前它不被调度，TTFT 至少是编译时间。要说出后者及其原因；只说“编译慢”、没有落到谁的哪种延迟的，不给分。
# - **怎样藏起来（1 分）**：`grammar_init` 把编译交给线程池，请求带着 Future 处于 `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`；`schedule()` 只非阻塞地检查 Future，未就绪就跳过它、继续调度其他请求，就绪后改为 `WAITING`。只说“放进线程池”、没说调度器跳过它而其他请求照常运行的，不给分。
# - 不要求、也不加分（写对不扣分）：编译失败时以 `FINISHED_ERROR` 只结束这一个请求；编译线程与 EngineCore 线程争用 CPU；编译缓存让重复的 schema 不再编译。
# - 0 分：认为等待编译期间整批停顿（一票否决）。
#
# **参考答案**
#
# 1. 代价：`XgrammarBackend.compile_grammar` 要把 schema 变成文法，再对整个词表预计算 token 能否接在各个状态之后，代价随词表与 schema 复杂度增长。若放在 EngineCore 的 busy loop 里同步做，所有正在解码的请求都要等这段时间，TPOT 出现尖峰。
# 2. 隐藏：`EngineCore.preprocess_add_request`（输入处理线程）→ `StructuredOutputManager.grammar_init` 把 `_create_grammar` 提交到线程池，请求的 `structured_output_request.grammar` 是一个 Future，状态为 `WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`（`Request.__init__` 设好的）。`Scheduler.schedule()` 的等待循环对它调用 `_try_promote_blocked_waiting_request`：Future 未完成就把它放进 skipped 队列、继续看后面的请求；完成则改为 `WAITING` 正常准入；其他请求的每一步不受影响。（不要求：异常则记入 `grammar_compile_error_reqs`，在 `update_from_output` 里以 `FINISHED_ERROR` 结束。）
# 3. 没藏住：这个请求的 TTFT ≥ 编译时间。以下不要求：编译线程占用 CPU 核心（vLLM 的编译池 `max_workers = (cpu_count + 1) // 2`，约一半核心），在 CPU 紧张时会挤占 EngineCore 线程。相同 key（种类 + 规格）的编译结果被缓存（vLLM 借 xgrammar 的编译缓存；minivllm 用 `StructuredOutputManager.compiled`），重复的 schema 第二次几乎零成本。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l08_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 引入投机解码后（第 4 步），为什么草稿位置的 bitmask 要沿草稿推进 grammar、填完再回滚？不合 grammar 的草稿为什么要截掉，截掉后输出为何仍服从 grammar？（第 9 课细讲；这里只需知道：每步为一个请求猜 $k$ 个草稿，目标模型一次前向给出 $k+1$ 行 logits（含 bonus 位置），再从前往后决定接受哪些。）
#
# 评分要求：必须包含对象、状态变化、正确性或成本链。
#
# === BEGIN MARK SCHEME ===
#
# **评分要点**（两部分各 1 分；机制（逐行推进、`rollback`、`validate_tokens` 截断）已在“它如何工作”第 4 步给出，得分看“为什么”；不要求其他源码名字）：
#
# - **行数与状态（1 分）**：每个受约束请求每步要 $k+1$ 行 bitmask，第 $i$ 行对应“已接受前 $i$ 个草稿”之后的 grammar 状态；所以要沿草稿推进 matcher、逐行填充，填完再退回本步开始时的状态（真正接受多少由验证决定，之后才推进）。要说出为什么回滚：填行时还不知道验证接受几个草稿，matcher 必须停在本步开始时的状态（vLLM：`accept_tokens` / `rollback`，matcher 以 `max_rollback_tokens` 创建）；只复述“推进后回滚”、没有这个理由的不给分。
# - **不合法的草稿（1 分）**：不合 grammar 的草稿不能推进 matcher，之后的行无从计算；要在它那里截断（vLLM：`validate_tokens` 保留合法的最长前缀，推迟路径上用 -1 补齐，其后各行填全 1 掩码），并且屏蔽后的分布给它概率 0，验证时必被拒绝，输出仍服从受约束的分布。给出截断的理由（matcher 推进不过不合法的 token）或“屏蔽后概率为 0、必被拒绝，输出仍服从 grammar”之一即可。
# - 0 分：认为草稿可以不受约束、只约束最终 token（一票否决）。
#
# **参考答案**
#
# 1. 行数：没有投机解码时每个请求一行；有 $k$ 个草稿时，目标模型一次前向给出 $k+1$ 个位置的 logits，每个位置都要按“接受了前面草稿之后”的 grammar 状态屏蔽。vLLM 的 `StructuredOutputManager.grammar_bitmask` 为每个请求分配 $1+k$ 行（缓冲区大小 `max_num_seqs * (1 + num_speculative_tokens)`），对第 $i$ 个草稿先填一行再 `accept_tokens([token])` 前进，最后填 bonus 行，然后 `rollback(state_advancements)` 把 matcher 退回本步开始时的状态。
# 2. 不合法的草稿：调度器在接收草稿时用 `grammar.validate_tokens(spec_token_ids)` 只保留 grammar 接受的最长前缀（不推进状态；`update_draft_token_ids` 与 `update_draft_token_ids_in_output`），后者把被截掉的位置用 -1 补齐到调度的草稿数，填 bitmask 时第一个 -1 所在行仍按当前状态受约束，此后不再推进 grammar，之后的 -1 行填全 1（这些行的结果用不到），bonus 行仍受约束；拒绝采样在屏蔽后的分布上验证草稿，保证输出分布仍是受约束的目标分布。
# 3. 状态与成本：`XgrammarBackend` 用 `max_rollback_tokens=num_speculative_tokens` 创建 matcher，才能回滚；每步的 grammar CPU 时间约乘以 $1+k$，更需要与 forward 重叠；runner 的 `apply_grammar_bitmask` 重排时每个请求的 logits 偏移要加上它之前请求的草稿数。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（与 xgrammar 的 bitmask 逐字相同 1 分、接入真实引擎 1 分）、边界条件 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分：必须包含对象、状态变化、正确性或成本链；
#
# 总分 10 分，至少 8 分通过。引擎自己的屏蔽在 `minivllm/structured_output/utils.py`，先独立完成再读。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson08", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读，不计分：在真实 vLLM 上运行、与 vLLM 的全部差异和参考资料。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 第一张表：评分场景里“批内顺序与调度顺序不同”的那一批交给 vLLM 自己的 `StructuredOutputManager.grammar_bitmask`（选项由 `SamplingParams._validate_structured_outputs` 改写成 EBNF，xgrammar 编译）。vLLM 按调度顺序出行，你的函数按批内顺序；按请求 id 重排后应逐字相同。
#
# 第二张表：vLLM 一步步走完一个 `choice` 请求，每步取一行 bitmask、随机选一个允许的 token 交给 `accept_tokens`；旁边是你的函数对同一前缀算出的允许集合，直到 EOS 后 grammar 终止。
#
# 主路径评分也读这些录制结果：本课全部批和三条这样的路径（`autograder/lesson08/vllm_view.py`）。录制只调用 `grammar_bitmask`，不经过 runner，也不做屏蔽。`make vllm` 之后，vLLM 的源码在 `.venv-vllm` 的 site-packages/vllm 下。

# %%
L08.vllm_side_by_side(choice_bitmask)

# %% [markdown]
# ### 参考资料
#
# - [vLLM structured output manager](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/structured_output/__init__.py)
# - [vLLM xgrammar backend](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/structured_output/backend_xgrammar.py)
# - [vLLM apply_grammar_bitmask（V1 runner）](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/structured_output/utils.py)
# - [Model Runner V2 的 StructuredOutputsWorker](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/worker/gpu/structured_outputs.py)
# - [vLLM EngineCore.step](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/core.py)
# - [vLLM structured outputs docs](https://docs.vllm.ai/en/latest/features/structured_outputs.html)
# - [xgrammar documentation](https://xgrammar.mlc.ai/docs/)
#
# 源码链接固定到本课对照的 commit；current docs、支持矩阵和默认参数会变化，部署前按目标版本重新核对。
#
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# 本课评分的机制与 vLLM 相同：bitmask 的布局与位序、EOS 的规则、先屏蔽再采样、bitmask 在发射 forward 与等待它之间计算。其余差别：
#
# - **异步调度**：vLLM 默认开启，busy loop 跑 `step_with_batch_queue`。decode 时受约束请求的上一步 token 总还在路上，所以 bitmask 与采样每步都推迟到上一步的输出推进 grammar 之后，这是常态；这时 GPU 已在跑本步的 forward。本课画的是同步的 `EngineCore.step`。
# - **V2 的屏蔽**：`StructuredOutputsWorker` 只拷贝受约束请求的行和它们的 logits 行号，用自己的 Triton kernel 屏蔽。
# - **V1 的屏蔽**：`apply_grammar_bitmask`（`v1/structured_output/utils.py`）拼一张与 logits 行数相同、其余行全 1 的 bitmask，交给 xgrammar 的 kernel。minivllm 照 V1 在 runner 里重排。
# - **谁按批内顺序排行**：练习的 `choice_bitmask` 直接按 `batch_req_ids` 出行；vLLM 的 `grammar_bitmask` 按调度顺序填，由 runner 重排。
# - **`choice` 的实现**：vLLM 用 `choice_as_grammar` 把选项写成 EBNF（`root ::= "yes" | "no"`），交给 xgrammar；TokenTrie 是本课的做法，本课模型上两者的 bitmask 逐字相同。
# - **编译的调用方**：vLLM 由输入处理线程里的 `preprocess_add_request` 调用 `grammar_init`，`Request` 创建时就处于等待编译的状态；minivllm 的输入线程只解码消息，由 busy loop 上的 `EngineCore.add_request` 调用。
# - **编译缓存**：vLLM 借 xgrammar 的编译缓存，minivllm 用 `StructuredOutputManager.compiled`；两边的编译池都约占一半 CPU 核。
# - **xgrammar 怎样填一行**：编译时为文法的每个位置预先判定多数 token 能否接上（token mask 缓存），每步只现场检查少数与上下文有关的 token，不必扫整个词表。编译好的文法也有缓存，上限是 `VLLM_XGRAMMAR_CACHE_MB`（默认 512 MB）。
# - **没有 grammar 的步骤**：minivllm 的调度器用一个计数器关掉所有 grammar 钩子，不付代价。
# - **runner 的拆分**：vLLM 的 runner 每步在 forward 后返回 None，由 `sample_tokens` 采样；minivllm 只在有受约束请求时这样拆开。
# - **草稿**：不合 grammar 的草稿由 `validate_tokens` 截断。只有在推迟 bitmask 的路径上，`update_draft_token_ids_in_output` 才把截掉的位置用 -1 补齐；填 bitmask 时第一个 -1 所在行仍受约束，之后不再推进 grammar，后面的 -1 行全 1；没有 reasoner 时 bonus 行仍受约束。
#
# ← 上一课：第 7 课：采样器：temperature、top-k/top-p、种子与 logprobs　｜　下一课 →：第 9 课：投机解码：n-gram 提议与拒绝采样
