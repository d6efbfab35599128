"""Lesson 7's wrong answers: each a few edits of the solution cell l07_sampler, with the misconception.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution and fail the parts in `fails` (tests/test_mutants.py, tests/test_lesson07_grading.py).
"""
from autograder.mutation import Mutant

CELL = "l07_sampler"
MAIN, ENGINE, BOUNDARY = "l07_main_path", "l07_real_engine", "l07_boundary"

MUTANTS = {
    "temperature_after_softmax": Mutant(CELL, (
        ("x = logits / temp.unsqueeze(1)", "x = logits"),
        ("probs = x.softmax(dim=-1)", "probs = x.softmax(dim=-1) / temp.unsqueeze(1)"),
    ), "Divides the probabilities by T after softmax: a per-row scale the race ignores, so T has no effect.",
        fails={MAIN, ENGINE},
        hint="温度应作用在 softmax 之前还是之后？它还有效果吗？"),
    "top_p_drops_crossing_token": Mutant(CELL, (
        ("drop = cum <= 1 - p.unsqueeze(1)", "drop = cum - probs_sort <= 1 - p.unsqueeze(1)"),
    ), "Keeps only tokens strictly inside p: drops the token whose probability crosses p.",
        fails={MAIN, BOUNDARY},
        hint="累积概率越过 p 的那个 token 应保留吗？"),
    "top_p_before_top_k_renormalisation": Mutant(CELL, (
        ("probs_sort = logits_sort.softmax(dim=-1)", "probs_sort = logits.sort(dim=-1).values.softmax(dim=-1)"),
    ), "Takes top-p over the whole vocabulary's probabilities, not over the top-k survivors renormalised.",
        fails={MAIN},
        hint="top-p 的累积概率是在哪个集合上、是否重新归一化后计算？"),
    "min_p_against_sum": Mutant(CELL, (
        ("probs.amax(dim=-1, keepdim=True)", "probs.sum(dim=-1, keepdim=True)"),
    ), "Scales min_p by the sum of the probabilities (1) instead of the top token's probability.",
        fails={MAIN, BOUNDARY},
        hint="min_p 的阈值应相对于什么来缩放？"),
    "one_generator_for_the_batch": Mutant(CELL, (
        ("q[i].exponential_(generator=gen)", "q[i].exponential_(generator=next(iter(generators.values())))"),
    ), "Draws every seeded row from one generator: a seeded request's tokens depend on who shares its batch.",
        fails={MAIN, ENGINE},
        hint="带 seed 的请求，它的 token 会不会受同批其他请求影响？"),
    "logprobs_after_temperature": Mutant(CELL, (
        ("raw_logprobs = logits.log_softmax(dim=-1)",
         "raw_logprobs = (logits / md.temperature.clamp(min=SAMPLING_EPS).unsqueeze(1)).log_softmax(dim=-1)"),
    ), "Reports logprobs of the temperature-scaled distribution instead of the model's raw logits.",
        fails={MAIN, ENGINE},
        hint="返回的 logprobs 应来自哪个分布？"),
    "sort_for_top_k": Mutant(CELL, (
        ("kth = logits.topk(int(k_idx.max()) + 1, dim=-1).values",
         "kth = logits.sort(dim=-1, descending=True).values"),
    ), "Sorts the whole vocabulary for top-k alone: right masks, but the fast path is gone.",
        fails={ENGINE, BOUNDARY},
        hint="结果对了，但只做 top-k 时需要对整个词表排序吗？"),
    "multiply_by_noise": Mutant(CELL, (
        ("return (probs / q).argmax(dim=-1)", "return (probs * q).argmax(dim=-1)"),
    ), "Multiplies by the exponential noise instead of dividing: argmax(p * q) is not a draw from p.",
        fails={MAIN},
        hint="用指数噪声做采样时，概率与噪声是怎么组合的？"),
    "top_p_strict_threshold": Mutant(CELL, (
        ("drop = cum <= 1 - p.unsqueeze(1)", "drop = cum < 1 - p.unsqueeze(1)"),
    ), "Drops with cumsum < 1 - p: keeps one token too many when p falls exactly on a cumulative sum (vLLM: <=).",
        fails={BOUNDARY},
        hint="累积和恰好落在 p 上时保留几个 token？检查比较符。"),
    "greedy_only_at_zero_temperature": Mutant(CELL, (
        ("return torch.where(is_greedy, greedy, sampled), raw_logprobs",
         "return torch.where(md.temperature == 0, greedy, sampled), raw_logprobs"),
    ), "Keeps the greedy token only where temperature is exactly 0: a 1e-6 row (below SAMPLING_EPS) samples at T = 1.",
        fails={MAIN, ENGINE},
        hint="温度极小但不为 0 的行怎么处理？回顾 SAMPLING_EPS。"),
    "topk_of_the_largest_k": Mutant(CELL, (
        ("kth = logits.topk(int(k_idx.max()) + 1, dim=-1)", "kth = logits.topk(int(k.max()), dim=-1)"),
    ), "Takes topk(max k): right while some row uses top-k, but a batch whose every k is 0 (off) takes topk(0).",
        fails={BOUNDARY},
        hint="一批里每行的 k 都是 0（关闭）时会怎样？"),
    "kth_from_unclamped_k": Mutant(CELL, (
        ("kth = logits_sort.gather(1, (vocab - k_eff).long().unsqueeze(1))",
         "kth = logits_sort.gather(1, (vocab - k).long().unsqueeze(1))"),
    ), "Reads the k-th value with the raw k: a row with k = 0 (off) beside top-p indexes past the vocabulary.",
        fails={MAIN},
        hint="k = 0（关闭 top-k）的行，读第 k 个值时下标会越界吗？"),
    "whole_batch_from_each_generator": Mutant(CELL, (
        ("q[i].exponential_(generator=gen)", "q.exponential_(generator=gen)"),
    ), "Refills the whole noise tensor from each seeded generator: row i ends with the last generator's noise.",
        fails={MAIN},
        hint="每个 generator 填充的是哪一行的噪声？"),
    "min_p_as_absolute_probability": Mutant(CELL, (
        ("threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)", "threshold = min_p.unsqueeze(1)"),
    ), "Compares probabilities with min_p itself, not min_p times the row's top probability.",
        fails={MAIN, BOUNDARY},
        hint="min_p 是绝对概率阈值，还是相对某个概率的比例？"),
}
MUTANTS.update({
    "logprobs_skipped_at_zero": Mutant(CELL, (
        ("if md.max_num_logprobs is not None else None", "if md.max_num_logprobs else None"),
    ), "Tests max_num_logprobs for truth: logprobs=0 (the sampled token's logprob only) gets no logprobs at all.",
        fails={MAIN, ENGINE},
        hint="logprobs=0 是“不要 logprobs”吗？vLLM 这时返回什么？"),
    "logprobs_via_softmax_log": Mutant(CELL, (
        ("raw_logprobs = logits.log_softmax(dim=-1)", "raw_logprobs = logits.softmax(dim=-1).log()"),
    ), "Takes log(softmax): a token over ~100 nats below the top underflows to probability 0 and reports -inf.",
        fails={MAIN},
        hint="logits 相差 100 nats 以上时，先 softmax 再 log 会得到什么？"),
    "softmax_without_max_shift": Mutant(CELL, (
        ("probs = x.softmax(dim=-1)", "probs = x.exp() / x.exp().sum(dim=-1, keepdim=True)"),
    ), "Normalises exp(x) by hand without subtracting the row maximum: logits near 120 overflow to inf and NaN.",
        fails={MAIN},
        hint="logits 很大（例如 120）时，exp 在 float32 里会怎样？"),
    "top_k_in_probability_space": Mutant(CELL, (
        ("kth = logits.topk(", "kth = logits.softmax(dim=-1).topk("),
        ("return logits.masked_fill(logits < kth,", "return logits.masked_fill(logits.softmax(dim=-1) < kth,"),
    ), "Takes the k-th largest probability as the threshold: probabilities that underflow to 0 tie, and all stay.",
        fails={BOUNDARY},
        hint="第 k 大的值在概率空间里下溢成 0 时，阈值还能区分 token 吗？"),
    "logprobs_always": Mutant(CELL, (
        ("raw_logprobs = logits.log_softmax(dim=-1) if md.max_num_logprobs is not None else None",
         "raw_logprobs = logits.log_softmax(dim=-1)"),
    ), "Returns raw logprobs even when no request asked for them (max_num_logprobs is None): a wasted log_softmax "
       "over the vocabulary every step, and logprobs the engine would gather for nobody.",
        fails={MAIN, ENGINE},
        hint="没有任何请求要 logprobs 时，sample 还应该算并返回它们吗？vLLM 的 Sampler.forward 怎样判断“有人要”？"),
    "seed_zero_is_no_seed": Mutant(CELL, (
        ("    if len(generators) != probs.shape[0]:",
         "    generators = {i: g for i, g in generators.items() if g.initial_seed()}  # seed 0: no seed\n"
         "    if len(generators) != probs.shape[0]:"),
    ), "Treats seed 0 as \"no seed\" (`if seed:`): a request with seed=0 draws from the global RNG, so its tokens "
       "change with the batch.",
        fails={MAIN, ENGINE},
        hint="seed=0 是“没有种子”吗？判断一个请求有没有种子时，0 和 None 有什么不同？"),
    "seed_restarted_every_step": Mutant(CELL, (
        ("q[i].exponential_(generator=gen)",
         "q[i].exponential_(generator=torch.Generator().manual_seed(gen.initial_seed()))"),
    ), "Restarts each seeded row's noise from its seed every step: reproducible, but the same draw step after step.",
        fails={MAIN},
        hint="带种子的请求每一步都从 seed 重新开始取噪声，连续多步的 token 还服从 probs 吗？"),
    "seeded_rows_uniform_noise": Mutant(CELL, (
        ("q[i].exponential_(generator=gen)", "q[i].uniform_(generator=gen)"),
    ), "Draws the seeded rows' race noise from U(0, 1) instead of Exp(1): reproducible, but not a draw from p.",
        fails={MAIN},
        hint="带种子的行用的噪声分布对吗？argmax(p / q) 要求 q 服从什么分布？"),
    "seeded_noise_from_log_uniform": Mutant(CELL, (
        ("q[i].exponential_(generator=gen)", "q[i] = -torch.rand(q.shape[1], generator=gen).log()"),
    ), "Draws the seeded rows' Exp(1) noise as -log(U): the right distribution and reproducible, but another stream "
       "than vLLM's exponential_, so a seed gives other tokens than the pinned vLLM gives (only the vLLM comparison sees it).",
        fails={MAIN},
        hint="同一个 seed，你的 token 和 vLLM 的一样吗？它从 generator 取噪声用的是哪个函数？"),
})
