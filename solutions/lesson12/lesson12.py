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
# # 第 12 课：前端与在线服务：AsyncLLM、ZMQ/msgspec、SSE 与基准测试
#
# ## 本课目标与通过标准
#
# 本课产出：说清一个流式请求怎样从 HTTP 穿过两个进程、变成 SSE 事件；写出输出处理器里每个请求的那一步（增量反分词、停止串与 hold-back）和客户端断开时的 abort 路径。
#
# 通过要求：代码断言全部通过；Q1～Q3 各用 3～5 句回答；能指出下面三件事；总分至少 8/10。
#
# - 正确性不变量：流式增量拼起来等于非流式文本，停止串不出现在任何增量里；
# - 性能边界：进程拆分用每步一次输出的序列化与 ZMQ 单向传输（外加一个进程），换来前端与模型步的重叠（Q1）；
# - 需要 benchmark 才能确认的结论：排队如何推高 TTFT（Q3）。
#
# | 部分 | 分值 | 评分方式 |
# |---|---|---|
# | 代码·主路径（真实 `OutputProcessor` 上的流 1 分 + 真实服务器与 openai 客户端 1 分） | 2 | 自动 |
# | 代码·边界条件（第一个 token 是停止串、输出比 hold-back 短、一步给出全部 token、EOS、客户端断开） | 1 | 自动 |
# | 代码·能映射回源码对象（`SOURCE_MAP`） | 1 | 自动 |
# | Q1～Q3 | 各 2 | 人工，按评分规则 |
#
# 没有 nbgrader 时（例如 Colab），运行最后的“自检”单元格（或 `python -m autograder check lesson12`）。

# %% [markdown]
# ## 源码版本与阅读方法
#
# 源码固定在 vLLM {{VLLM_VERSION}}（commit {{VLLM_COMMIT}}）。沿一个流式请求的一生读，下面只摘本课用到的约 100 行。
#
# | 顺序 | vLLM 文件与入口 | minivllm 对应文件 | 带着什么问题读 |
# |---|---|---|---|
# | 1 | `vllm/v1/engine/async_llm.py`：`AsyncLLM.generate`（L608–L616）、`abort`（L732–L738） | `minivllm/engine/async_llm.py` | `generate()` 被取消时做哪两件事？ |
# | 2 | `vllm/v1/engine/output_processor.py`：`OutputProcessor.process_outputs`（L652–L661、L695–L699） | 同名文件 | 为什么还要 abort EngineCore 里的请求？ |
# | 3 | `vllm/v1/engine/detokenizer.py`：`BaseIncrementalDetokenizer.__init__`（L85–L90）、`update`（L116–L120、L129–L143）、`get_next_output_text`（L153–L165） | 同名文件 | hold-back 扣几个字符？运行中与结束时各发出多少？ |
# | 4 | `vllm/v1/engine/detokenizer.py`：`FastIncrementalDetokenizer.__init__`（L184–L187）、`check_stop_strings`（L337–L362） | 同名文件 | 解码流先喂什么？停止串从哪里找起？ |
#
# **runner**：本课不涉及 runner。

# %%
# 上表各行在 vLLM {{VLLM_VERSION}} 源码里的样子：文件路径、行号与逐行原文（行号与上表一致；源码由第一个单元格获取并校验）。
from autograder.vllm_source import show_vllm

show_vllm("vllm/v1/engine/async_llm.py", "AsyncLLM.generate", lines=(608, 616))
show_vllm("vllm/v1/engine/async_llm.py", "AsyncLLM.abort", lines=(732, 738))
show_vllm("vllm/v1/engine/output_processor.py", "OutputProcessor.process_outputs", lines=(652, 661))
show_vllm("vllm/v1/engine/output_processor.py", "OutputProcessor.process_outputs", lines=(695, 699))
show_vllm("vllm/v1/engine/detokenizer.py", "BaseIncrementalDetokenizer.__init__", lines=(85, 90))
show_vllm("vllm/v1/engine/detokenizer.py", "BaseIncrementalDetokenizer.update", lines=(116, 120))
show_vllm("vllm/v1/engine/detokenizer.py", "BaseIncrementalDetokenizer.update", lines=(129, 143))
show_vllm("vllm/v1/engine/detokenizer.py", "BaseIncrementalDetokenizer.get_next_output_text", lines=(153, 165))
show_vllm("vllm/v1/engine/detokenizer.py", "FastIncrementalDetokenizer.__init__", lines=(184, 187))
show_vllm("vllm/v1/engine/detokenizer.py", "check_stop_strings", lines=(337, 362))

# %% nbgrader={"grade": false, "grade_id": "l12_setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# 准备（锁定）：静音无害的警告（评分单元格不能写 stderr）。
import logging
import os
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

from tokenizers.decoders import DecodeStream  # noqa: E402,F401  (the exercise's incremental decoder)

from autograder import lesson12 as L12  # noqa: E402
from autograder.common import ______, report, self_check, short_errors  # noqa: E402,F401

short_errors("lesson12")  # 评分单元格失败时只显示三行：哪一部分、错在哪、第一处不符（完整 traceback：%tb）

# %% [markdown]
# ## 核心心智模型
#
# ### 1. 它是什么，解决什么问题
#
# 在线服务的请求随时到达、随时离开，每个请求要尽快看到第一个 token（TTFT），之后稳定流出（TPOT、ITL）。vLLM V1 把服务拆成两个进程：
#
# - **API 服务器进程**（FastAPI + `AsyncLLM`）：HTTP、分词、反分词、停止串、流；
# - **EngineCore 进程**：只做调度、前向与采样（含 EOS、stop token、`max_tokens` 判停），不做反分词和停止串。
#
# 两边经 ZMQ 交换 msgspec 编码的小消息，前端的工作与 EngineCore 的步重叠。
#
# ### 2. 它如何工作
#
# 一个流式请求的一生：
#
# 1. **HTTP → AsyncLLM**：`OpenAIServingCompletion` 经 `OnlineRenderer` 分词，再调 `AsyncLLM.generate`；`OutputProcessor` 为请求登记反分词器和信箱（`RequestOutputCollector`）。
# 2. **ZMQ → EngineCore**：`AsyncMPClient` 把请求编码成 msgpack 数组，经 ROUTER/DEALER 送出；EngineCore 的输入线程解码入队，忙循环（`run_busy_loop`）调度、前向。
# 3. **输出回来**：每步的 `EngineCoreOutputs` 由输出线程编码，经 PUSH/PULL 发回；前端的输出处理 task 交给 `OutputProcessor.process_outputs`。
# 4. **反分词**：新 token 交给请求的反分词器，得到新文本、检查停止串，把可发出的增量放进信箱。EngineCore 不做反分词，前端发现停止串后经 `reqs_to_abort` abort 它里面的请求。
# 5. **SSE**：`generate()` 从信箱取出输出并 yield，服务器写成 `data: {...}`，最后是 `data: [DONE]`。
#
# ### 3. 正确性条件与常见误区
#
# - **增量反分词**：字节级 BPE 词表里没有的汉字或 emoji，其 UTF-8 字节会拆进 2～4 个 token（本课的小词表模型几乎每字如此），逐 token 独立解码会得到 U+FFFD（�）。`DecodeStream` 记住前面的 token，字节凑齐才吐出文本。
# - **解码流要先看到 prompt**：Metaspace 解码器去掉序列开头的 `▁`（空格），空的解码流会把 `"▁what"` 解成 `"what"`，所以 vLLM 的 `DecodeStream` 先喂入 prompt。
# - **停止串与 hold-back**：停止串可以跨 token、跨步出现，这一步的文本可能以它的前缀结尾（停止串 `"Juliet is"`，这一步的文本以 `" Juliet"` 结尾，`" is"` 下一步才到）。
# - 已发出的增量收不回来，所以运行中的请求扣下最后 `len(最长停止串) - 1` 个字符（`stop_buffer_length`；没有停止串或 `include_stop_str_in_output=True` 时为 0），结束时再全部放出。
# - **搜索起点**：只在“新文本加上前面 `len(s) - 1` 个字符”里找。找到后文本截到停止串之前，同一步里它后面的文本也丢掉。
# - **断开连接**：Starlette 的 `StreamingResponse` 发现断开（条件见附录），取消 body 迭代器，`generate()` 随即 `abort`：前端忘掉这个流（`OutputProcessor.abort_requests`），**并**通知 EngineCore。
# - 只做前一半，EngineCore 一直生成到 EOS、stop token 或 `max_tokens`（停止串只在前端查），占着 batch 的位置和 KV 块。
#
# ### 4. 性能与工程取舍
#
# - TTFT 主要由排队与 prefill 决定，TPOT/ITL 由每步时间决定；排队与 KV 压力看 /metrics：`num_requests_waiting`、`kv_cache_usage_perc`。

# %% [markdown]
# ## 具体演示：一个请求穿过两个进程
#
# 下面启动真实服务器（EngineCore 在独立进程），发一个 12 token 的流式请求，记录三个时间：
#
# - EngineCore 每步结束的时刻（`EngineCoreOutputs.timestamp`）；
# - 前端收到这批输出的时刻；
# - 客户端收到每个 SSE 事件的时刻。

# %%
timeline = L12.request_timeline()
L12.print_timeline(timeline)
L12.plot_timeline(timeline);

# %% [markdown]
# 图 12-1：一个流式请求在两个进程间的时间线。第一个点之前是 HTTP 解析、分词、ZMQ 发送、排队与 prefill。之后 EngineCore 每步结束（下行），前端很快收到输出（中行），再经反分词、JSON、SSE 到客户端（上行）。
#
# EngineCore 的步之间不等前端：前端的工作与下一步的前向重叠。机器忙时前端抢不到核，几步的输出在 ZMQ 里排队，前端腾出手后接连取走（信箱再合成一个增量），“ZMQ+decode”一列变大。

# %% [markdown]
# ## 实践任务：唯一代码填空题
#
# 下面是 vLLM `FastIncrementalDetokenizer` 与 `AsyncLLM.abort` 的精简版（接口同 minivllm 的 `IncrementalDetokenizer`）：
#
# - `OutputProcessor` 为每个请求建一个本类实例，每步调 `update`（`stop_terminated`：最后一个 token 是 EOS 或 stop token），再调 `get_next_output_text` 取出发给流的文本（`delta=False`：到目前为止的全文，运行中同样扣掉 hold-back）；
# - 解码流：`DecodeStream(ids=..., skip_special_tokens=...)`；`stream.step(rust_tokenizer, token_id)` 返回新文本或 None；
# - `abort_stream(engine, request_id)` 是 `generate()` 被取消时走的路径（vLLM 的 `AsyncLLM.abort`；minivllm 的 `engine.engine_core` 上要调用同步的那个（不带 `_async`））。
#
# 6 处 `______` 是决策点，要照顾到：字节级 BPE 与 Metaspace 分词器、半个字符结尾的 prompt、零或多个停止串、`include_stop_str_in_output` 与 `skip_special_tokens`、一步多 token。
#
# 只改 `______` 处，不删断言、不放宽条件。

# %% nbgrader={"grade": false, "grade_id": "l12_streaming_detokenizer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class StreamingDetokenizer:
    """One request's output text, grown as tokens arrive; finds stop strings; holds back text while streaming."""

    def __init__(self, tokenizer, params, prompt_token_ids):
        self.rust_tokenizer = tokenizer._tokenizer          # the Rust tokenizer behind the HF fast tokenizer
        # TODO 1. The incremental decoder: what must it have seen before the first output token (a SentencePiece
        #         "▁word" decodes to " word" only after other text), and which tokens does it leave out?
        self.stream = DecodeStream(ids=list(prompt_token_ids), skip_special_tokens=params.skip_special_tokens)  ### BLANK
        self.stop = list(params.stop or [])
        self.include_stop = params.include_stop_str_in_output
        self.output_text = ""
        self.sent = 0                                        # characters already given to the stream
        # TODO 2. While running, how many trailing characters may still become the start of a stop string?
        self.stop_buffer_length = max((len(s) for s in self.stop), default=1) - 1  ### BLANK
        if self.include_stop:
            self.stop_buffer_length = 0

    def update(self, new_token_ids, stop_terminated):
        """Append the tokens' text; return the stop string that ends the request, if one completed."""
        if stop_terminated and not self.include_stop:
            new_token_ids = new_token_ids[:-1]               # an EOS / stop token adds no text
        start = len(self.output_text)
        for token_id in new_token_ids:
            piece = self.stream.step(self.rust_tokenizer, token_id)  # None until a character's bytes are complete
            self.output_text += piece or ""
        # TODO 3. A stop string may have begun before this step's text: where does the search start?
        best, best_start, best_end = None, 0, len(self.output_text) + 1
        for s in self.stop:
            i = self.output_text.find(s, max(0, start - len(s) + 1))  ### BLANK
            if i != -1 and i + len(s) < best_end:
                best, best_start, best_end = s, i, i + len(s)
        if best is not None:
            # TODO 4. What is left of the text when a stop string completed?
            self.output_text = self.output_text[:best_end if self.include_stop else best_start]  ### BLANK
        return best

    def get_next_output_text(self, finished, delta):
        """The whole text so far, or with delta=True only what was not given before."""
        if finished:
            end = len(self.output_text)
        else:
            # TODO 5. A running request keeps back what could still turn into a stop string.
            end = len(self.output_text) - self.stop_buffer_length  ### BLANK
        if not delta:
            return self.output_text[:max(end, 0)]
        text = self.output_text[self.sent:end] if end > self.sent else ""  # end may be below sent, even negative
        self.sent += len(text)
        return text


def abort_stream(engine, request_id):
    """The client went away (its generate() was cancelled): end the request on both sides of the socket."""
    aborted = engine.output_processor.abort_requests([request_id])   # the frontend forgets the stream
    if aborted and not engine.errored:
        # TODO 6. Who else still holds this request, its KV blocks and its slot in the batch?
        engine.engine_core.abort_requests(aborted)  ### BLANK


# %%
# 逐项报告（不会中断 Run All）：每个自动评分部分一行，✗ 后面是第一处不符合的地方。
report("lesson12", globals())

# %% [markdown]
# 第一项检查：`OutputProcessor` 用你的类处理已知文本的 token，分组不均匀：停止串跨 token（含空格开头的）、几个停止串、非流式、中文和 emoji、Metaspace、prompt 以半个字符结尾。每个增量与 vLLM 规则的结果比较。

# %% nbgrader={"grade": true, "grade_id": "l12_main_path", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
chunks = L12.expect_stream(StreamingDetokenizer, abort_stream, L12.TEXT, ["Juliet is"], [1] * 400, "停止串跨 token")
print(chunks[-6:])
assert all("Juliet is" not in c for c in chunks)
chunks = L12.expect_stream(StreamingDetokenizer, abort_stream, L12.MULTIBYTE, None, [1] * 400, "多字节")
assert "".join(chunks) == L12.MULTIBYTE and "\ufffd" not in "".join(chunks)
### BEGIN HIDDEN TESTS
L12.check_main_path(StreamingDetokenizer, abort_stream)
### END HIDDEN TESTS

# %% [markdown]
# 第二项检查：真实服务器与 openai 客户端。换上你的类后，非流式输出和流式增量拼起来都要等于引擎的参考输出。
#
# 再从参考文本中取一个跨 token 的 7 字符片段当停止串：每个增量都不含它，流正好停在它前面；另测多个停止串与 `include_stop_str_in_output`。

# %% nbgrader={"grade": true, "grade_id": "l12_real_server", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L12.check_real_server(StreamingDetokenizer, abort_stream)
print("真实服务器检查通过：流式增量拼起来等于非流式文本，停止串没有出现在任何增量里。")

# %% [markdown]
# ## 检查方法
#
# 运行断言；再把 hold-back 关掉（`stop_buffer_length = 0`）重跑跨 token 的停止串，看第一个“泄漏”的增量（Q2 用）。

# %%
class NoHoldBack(StreamingDetokenizer):
    def __init__(self, *args):
        super().__init__(*args)
        self.stop_buffer_length = 0


ids = L12.tokenizer().encode(L12.TEXT, add_special_tokens=False)
leaky, _, _ = L12.stream_ids(NoHoldBack, abort_stream, ids, L12.stop_params(stop=["Juliet is"]), [1] * 400)
print("没有 hold-back 时的最后几个增量：", leaky[-4:], " 拼起来的结尾：", repr("".join(leaky)[-12:]))
print("第一个越过非流式文本的增量（第几个，内容）：", L12.leaked_increment(leaky, L12.TEXT[:L12.TEXT.find("Juliet is")]))

# %% nbgrader={"grade": true, "grade_id": "l12_boundary", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
assert "".join(L12.expect_stream(StreamingDetokenizer, abort_stream, L12.TEXT, ["ROMEO"], [3, 1, 1] * 100,
                                 "第一个 token 就是停止串")) == ""
chunks = L12.expect_stream(StreamingDetokenizer, abort_stream, L12.TEXT, ["Romeo?!"], [1] * 400, "未完成的停止串前缀")
### BEGIN HIDDEN TESTS
L12.check_boundary(StreamingDetokenizer, abort_stream)
### END HIDDEN TESTS

# %% [markdown]
# 隐藏测试还查停止串的最后一个字符单独一步，以及断开后 abort 是否到达 EngineCore（KV 块全部空闲）。
#
# ## 基准测试：`minivllm bench serve`
#
# 以三个请求率跑 `minivllm bench serve`：16 个请求，随机 32 token prompt，各输出 16 个 token，Poisson 到达；`inf` 即同时发出。

# %%
bench = L12.bench_rates()
L12.print_bench(bench)
L12.plot_bench(bench);

# %% [markdown]
# 图 12-2：TTFT、TPOT、ITL 的中位数与 p99 随请求率变化；表下一行是这次运行的数字：
#
# - 请求率低于服务能力时，请求一来就被调度：TTFT 约为固定开销（HTTP、分词、ZMQ、SSE）加一次 prefill，TPOT 约小 batch 的一步；
# - `inf` 时请求排队等前面的 prefill，TTFT 跳高；batch 变大，TPOT 上升；
# - 2 与 8 时 ITL 的 p99 明显高于中位数：尾部由偶发的长步决定。负载低时多是共享 CPU 的抖动；请求率高时还有新请求的 prefill 插进 decode 中的 batch。
#
# 负载下 5 次运行，后两条次次成立；数字只对本机本负载成立。

# %% [markdown]
# ## 映射回源码对象
#
# 在 vLLM {{VLLM_COMMIT}} 中找到每个概念的名字（函数、类或属性名；大小写不限）。括号里是去哪找，每个约一分钟。
#
# - `prefix_reset`：捕获 “Invalid prefix” 错误、换一个新解码流再试的方法（`detokenizer.py` 里 `FastIncrementalDetokenizer.decode_next` 第一行调用的）；
# - `fast_switch`：决定能不能用 `DecodeStream` 快路径的模块级常量（`detokenizer.py` 开头，`from_new_request` 里也用它）；
# - `slow_prompt_tokens`：把 prompt 的 id 变成 token 字符串与两个偏移量的函数（`detokenizer.py` 里 `SlowIncrementalDetokenizer.__init__` 调用的）；
# - `disconnect_listener`：等待 `http.disconnect` 消息的协程函数（`entrypoints/serve/utils/api_utils.py` 里 `with_cancellation` 的 `cancellation_task` 运行的）；
# - `arrivals`：按请求率逐个产出请求的异步生成器（`vllm/benchmarks/serve.py` 的 `benchmark` 里 `async for` 遍历的）；
# - `zero_copy_threshold`：张量多大就作为零拷贝帧单独发送的阈值（`vllm/v1/serial_utils.py` 里 `MsgpackEncoder.__init__` 的参数）。

# %% nbgrader={"grade": false, "grade_id": "l12_source_map_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
SOURCE_MAP = {
    "prefix_reset": "_protected_step",  ### BLANK
    "fast_switch": "USE_FAST_DETOKENIZER",  ### BLANK
    "slow_prompt_tokens": "convert_prompt_ids_to_tokens",  ### BLANK
    "disconnect_listener": "listen_for_disconnect",  ### BLANK
    "arrivals": "get_request",  ### BLANK
    "zero_copy_threshold": "size_threshold",  ### BLANK
}

# %% nbgrader={"grade": true, "grade_id": "l12_source_map", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
L12.check_source_map(SOURCE_MAP)

# %% [markdown] nbgrader={"grade": false, "grade_id": "l12_q1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q1（2 分）
#
# 图 12-1 里 EngineCore 的步与步之间不等前端。EngineCore 单独一个进程时，前端的哪些工作与下一步的前向重叠？这样拆分，每步多付出了什么（图 12-1 的表里哪一列能看到）？
#
# === BEGIN MARK SCHEME ===
#
# **评分**：
#
# - 2 分：说清两点。(a) 重叠：API 服务器进程里的 Python 工作——`OutputProcessor` 的增量反分词与停止串、组 `RequestOutput`、JSON 与 SSE，以及新请求的 HTTP 解析与分词——与 EngineCore 的下一步前向同时进行，列出其中两三项即可。(b) 代价：每步的 `EngineCoreOutputs` 要 msgspec 编码、经 ZMQ 发到前端、再解码，表里“ZMQ+decode”一列（核心造好输出到前端收到的时间）包含它，也包含前端抢不到核时的排队，是这部分代价的上界。
# - 1 分：只说清其中一点；或只说“避免 GIL / 可以并行”，没说出哪些工作。
# - 0 分：认为 EngineCore 要等前端处理完才开始下一步，或认为拆分会改变输出。
#
# 与同一进程相比（这些工作与前向抢同一个 GIL，只能排在两步之间），或多一个进程的内存与启动时间、停止串与断开要靠消息通知 EngineCore（`reqs_to_abort`、`abort_requests`），都是加深，不要求。
#
# **参考答案**
#
# EngineCore 的忙循环只做调度、前向和更新状态，输出交给 IO 线程编码发出后就开始下一步。前端进程收到这批输出后，`OutputProcessor` 逐请求做增量反分词、查停止串、把输出放进信箱，`generate()` 取出后服务器把它写成 JSON 的 SSE 事件；新到的请求也在这里解析 HTTP、分词。这些都与 EngineCore 的下一步前向同时进行，所以图 12-1 里核心的步是连着的。若在同一进程，它们与前向抢同一个 GIL，只能排在两步之间，每步都变长。代价是每步一次 msgspec 编解码和 ZMQ 传输：表里“ZMQ+decode”一列，本机中位数通常不到 1 ms，机器忙时会变大。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l12_q2", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q2（2 分）
#
# “检查方法”里关掉 hold-back 后，打印出的第一个越过非流式文本的增量带出了什么？为什么流式已经错了，非流式输出却仍然正确？
#
# === BEGIN MARK SCHEME ===
#
# **评分**：
#
# - 2 分：说清两点。(a) 那个增量里有停止串 `"Juliet is"` 的前缀（如 `" Juliet"`，以打印为准）：它在停止串完成之前就发给了客户端；等 `" is"` 到达，`update` 才找到完整的停止串，把 `output_text` 截到它之前，但已发出的字符收不回来，拼起来的流比非流式文本多出这段前缀。(b) 非流式（`delta=False`）只在请求结束时取一次全文，那时文本已经截断，所以正确。
# - 1 分：只说清其中一点；或只说“停止串漏出来了”，没说出为什么收不回来。
# - 0 分：认为非流式也错了，或认为流式在结束时删掉停止串就能补救。
#
# 说出 hold-back 长度为什么是 `len(最长停止串) - 1`、它让流落后几个字符，是加深，不要求。
#
# **参考答案**
#
# 打印出的增量含停止串的前缀 `" Juliet"`。没有 hold-back 时，这段文本在它的 token 到达的那一步就作为增量发出；下一步 `" is"` 到达，`update` 在文本里找到完整的 `"Juliet is"`，把 `output_text` 截到它之前，请求以 stop 结束。可 `sent` 已经越过了截断点，客户端手里多了停止串的前缀 `"Juliet"`（增量 `" Juliet"` 里的空格本属正文），SSE 里也没有“撤回”事件。非流式只在结束时读一次 `output_text`，读到的是截断后的全文，所以正确。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown] nbgrader={"grade": false, "grade_id": "l12_q3", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": true}
# ## Q3（2 分）
#
# 图 12-2 里，请求率从 8 到 `inf`（16 个请求同时发出）时，TTFT 与 TPOT 的中位数各多了多少毫秒（用你这次运行的表里 8 与 `inf` 两行）？TTFT 多出的时间主要花在哪里？
#
# === BEGIN MARK SCHEME ===
#
# **评分**：
#
# - 2 分：说清两点。(a) 引用自己这次运行的两个差值（TTFT 与 TPOT 的中位数各多了多少）。数字随机器与负载变化很大，以学生自己的数字为准，只要解释与数字一致。(b) TTFT 多出的主要是排队：16 个请求同时到达，前端要逐个解析、分词，后到的请求还要等 EngineCore 正在跑的那一步（先到请求的 prefill）结束，轮到它们时一步要 prefill 十几个 prompt，这一步也长。说“排在前面请求的 prefill 之后”即可。
# - 1 分：只有数字没有原因，或只有原因没有数字；或只说“batch 变大”，没说出排队。
# - 0 分：把本机的数字当作这个服务器的普遍容量，或把 TTFT 的上升归因于网络或 SSE。
#
# 说出 TPOT 上升是因为每步 decode 的 batch 从一两个变成 16 个，是加深，不要求。
#
# **参考答案**
#
# 作者的一次运行（数字只作示例）：8 req/s 时 TTFT 中位数约 13 ms、TPOT 约 2.6 ms；`inf` 时 TTFT 约 99 ms、TPOT 约 10 ms。TTFT 多了约 85 ms，TPOT 只多了约 8 ms。8 req/s 时请求陆续到达，来一个就在下一步被调度，TTFT 约为固定开销（HTTP、分词、ZMQ、SSE）加一次 prefill。`inf` 时 16 个请求一起到：先到的两个进了第一步，其余 14 个（还在前端处理或在 waiting 队列里）等这一步结束，再在一步里一起 prefill，所以 TTFT 的大头是排队和这一大步。TPOT 只因每步 decode 的 batch 变成 16 个请求而变慢。
#
# === END MARK SCHEME ===

# %% [markdown]
# 你的答案：

# %% [markdown]
# ## 评分规则
#
# - 代码 4 分：主路径 2 分（真实 `OutputProcessor` 1 分、真实服务器 1 分）、边界条件与断开连接 1 分、能映射回源码对象 1 分；
# - Q1～Q3 各 2 分，按每题的评分规则；
#
# 总分 10 分，至少 8 分通过。先独立完成，再对照 minivllm 与 vLLM 的实现。
#
# ### 自检
#
# 下面的单元格用与 nbgrader 相同的检查函数给代码部分打分（Q1～Q3 显示为待人工评分）。

# %%
self_check("lesson12", globals());

# %% [markdown]
# ## 附录（选读）
#
# 选读：几处细节、在真实 vLLM 上跑同样的流、进程拆分的实测、与 vLLM {{VLLM_VERSION}} 的全部差异和参考资料，不计入核心路径。

# %% [markdown]
# ### 细节
#
# - **prompt 以半个字符结尾**：补全这个字符的字节在输出里。tokenizers 0.23 的预热流此时把 prompt 的文本连同补全的字符一起吐出，vLLM {{VLLM_VERSION}} 的第一段输出因此重复 prompt。
# - 检查接受这个输出，也接受只给出补全字符的输出。
# - **信箱**：`RequestOutputCollector` 里最多放一个输出，读得慢的流把增量合并，不会越积越长。
# - **演示的时钟**：vLLM 的 `EngineCoreEvent` 说明时间戳不要跨进程比较；演示的两个进程在同一台 Linux 主机上共用 `CLOCK_MONOTONIC`，所以能画在一条时间轴上。

# %% [markdown]
# ### 在真实 vLLM {{VLLM_VERSION}} 上看同一件事
#
# 表里 19 条流：前 18 条是主路径评分逐步比较的，交给 vLLM 的 `IncrementalDetokenizer.from_new_request`，按 `OutputProcessor` 的方式逐步调用，与你的类并排。
#
# 逐步表里前两步为空：hold-back 留着最长停止串减 1 个字符。最后一行是另由一项检查评分的“prompt 以半个字符结尾”：vLLM 把“你”又输出一遍。

# %%
L12.vllm_side_by_side(StreamingDetokenizer);

# %% [markdown]
# ### 进程拆分的实测
#
# 同一批请求（8 个 prompt × 16 token），EngineCore 在本进程（`LLM(multiprocess=False)`）与独立进程（`multiprocess=True`）各跑 3 轮，交替，先热身。
#
# CPU 上前向与前端争抢同样的核，离线 `LLM.generate` 也没有 HTTP 与 SSE 可重叠，比值可能大于也可能小于 1。GPU 上前向在设备上跑，CPU 核空出来做前端工作，才是拆分划算的情形。结论要在目标硬件上 A B 交替测。

# %%
split = L12.process_split()
L12.print_split(split)

# %% [markdown]
# ### 与 vLLM {{VLLM_VERSION}} 的差异
#
# 本课评分的机制与 vLLM 相同；按 vLLM 写的答案不会失分。
#
# - **练习的类少的东西**：`min_tokens`、“Invalid prefix” 时重建解码流、`spaces_between_special_tokens`、非法 token id 的容错。评分检查不触发这些情况。
# - **反分词器**：vLLM 有 Fast（`DecodeStream`）和 Slow 两种，minivllm 只有 Fast。
# - **分词**：minivllm 的服务器在线程池里直接分词，没有 `OnlineRenderer`。
# - **断开连接**：Starlette 的 `StreamingResponse` 只在 ASGI spec < 2.4 时边发送边等 `http.disconnect`，uvicorn 报告 2.3；minivllm 用子类 `CancellableStreamingResponse`，任何 spec 下都等。
# - **abort**：vLLM 区分外部与内部 request id（并行采样的子请求等），用 `abort_requests_async` 通知 EngineCore；minivllm 只有一种 id，对应 `AsyncLLM._abort`，其 `AsyncMPClient.abort_requests` 是同步的。
# - **OutputProcessor**：vLLM 的还支持 pooling 输出与流式输入。排队时间：vLLM 由 QUEUED/SCHEDULED 事件算出，minivllm 放在第一个 `EngineCoreOutput.queue_time` 上。
# - **async scheduling**：vLLM 在支持时默认开，minivllm 默认关；它让下一步的调度与这一步的执行重叠，改变输出到达前端的时刻，不改变每次 update 带的 token 数（不开投机时每步一个）。
# - **指标与基准**：minivllm 的指标前缀是 `minivllm:`；`minivllm bench serve` 是 `vllm bench serve` 的子集。

# %% [markdown]
# ### 参考资料
#
# - [vLLM AsyncLLM](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/async_llm.py)
# - [vLLM core client（ZMQ）](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/core_client.py)
# - [vLLM output processor](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/output_processor.py)
# - [vLLM incremental detokenizer](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/v1/engine/detokenizer.py)
# - [vLLM OpenAI-compatible server](https://github.com/vllm-project/vllm/tree/{{VLLM_COMMIT}}/vllm/entrypoints/openai)
# - [vLLM OnlineRenderer](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/renderers/online_renderer.py)
# - [vLLM benchmarks/serve.py](https://github.com/vllm-project/vllm/blob/{{VLLM_COMMIT}}/vllm/benchmarks/serve.py)
# - [msgspec](https://jcristharif.com/msgspec/)、[ZeroMQ guide](https://zguide.zeromq.org/)、[Server-Sent Events](https://html.spec.whatwg.org/multipage/server-sent-events.html)
#
# 源码链接固定到本课审阅的 commit；默认参数与消息格式会变化，部署前按目标版本重新核对。
#
# ← 上一课：第 11 课：CUDA Graph 与动态形状　｜　本课程到此结束。
