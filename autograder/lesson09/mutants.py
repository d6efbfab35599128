"""Lesson 9's wrong answers: each a few edits of the solution cell l09_rejection_sample, with the misconception.

Instructor side only (`python -m autograder release` leaves this file out). tests/test_mutants.py grades each
one as a whole submission: it must score less than the solution and fail (at least) its `fails` parts.
Wrong random-path rules cannot show in a greedy engine run, so only greedy-visible mutants list l09_real_engine.

Not a mutant: accepting with u <= p/q without the min(1, .) clamp. Against a uniform u < 1 the two tests
accept exactly the same drafts, so no grader can (or needs to) tell them apart; the clamp matters where
the ratio is used as a probability on its own (a Bernoulli draw), which this exercise does not do.
"""
from autograder.mutation import Mutant

CELL = "l09_rejection_sample"
RANDOM_ACCEPT = "accept = float(uniform_probs[flat + j]) <= min(1.0, float(p[x]) / float(q[x]))"

MUTANTS = {
    "accept_if_p_ge_q": Mutant(CELL, (
        (RANDOM_ACCEPT, "accept = float(p[x]) / float(q[x]) >= 1.0"),
    ), "Reads the unclamped ratio p/q as a verdict (accept iff p >= q) instead of an acceptance probability.",
        fails={"l09_main_path"},
        hint="p/q 是一个判定，还是一个接受概率？"),
    "accept_ignores_q": Mutant(CELL, (
        (RANDOM_ACCEPT, "accept = float(uniform_probs[flat + j]) <= float(p[x])"),
    ), "Accepts with probability p(x) whatever the draft distribution (right only for one-hot n-gram drafts).",
        fails={"l09_main_path", "l09_boundary"},
        hint="接受概率是否考虑了草稿模型的分布？"),
    "greedy_accepts_likely": Mutant(CELL, (
        ("accept = int(p.argmax()) == x", "accept = float(p[x]) > 0.0"),
    ), "Greedy rows accept any draft the target gives some probability, not only its argmax.",
        fails={"l09_main_path", "l09_real_engine", "l09_boundary"},
        hint="贪心行接受草稿的条件是什么？有概率就够吗？"),
    "recover_from_p": Mutant(CELL, (
        ("residual = (p - q).clamp(min=0)", "residual = p"),
    ), "Resamples a rejected position from p instead of the normalised (p - q)+: the draft is over-sampled.",
        fails={"l09_main_path", "l09_boundary"},
        hint="拒绝后重采样应来自哪个分布？"),
    "no_bonus_token": Mutant(CELL, (
        ("out[i, k] = int(bonus_token_ids[i])", "out[i, k] = PLACEHOLDER_TOKEN_ID"),
    ), "Drops the bonus token when every draft is accepted (the free token of the last row is wasted).",
        fails={"l09_main_path", "l09_real_engine", "l09_boundary"},
        hint="所有草稿都被接受时，最后一行的输出还能用吗？"),
    "continue_after_rejection": Mutant(CELL, (
        ("            break", "            continue"),
    ), "Keeps verifying after the first rejection, though later rows were conditioned on the rejected draft.",
        fails={"l09_main_path", "l09_real_engine", "l09_boundary"},
        hint="第一个草稿被拒绝之后，后面的位置还能继续验证吗？"),
    "accepted_count_off_by_one": Mutant(CELL, (
        ("n = j + 1", "n = j"),
    ), "Counts accepted drafts one short: the engine keeps one token too few and rolls back one KV slot too many.",
        fails={"l09_main_path", "l09_real_engine", "l09_boundary"},
        hint="被接受的草稿数是否少算了一个？"),
    "greedy_accepts_a_tied_max": Mutant(CELL, (
        ("accept = int(p.argmax()) == x", "accept = float(p[x]) == float(p.max())"),
    ), "Greedy rows accept any draft tied at the top, not vLLM's argmax (the first maximal index).",
        fails={"l09_boundary"},
        hint="贪心行中多个 token 并列最大时，哪个才算 argmax？"),
    "accept_strictly_below_ratio": Mutant(CELL, (
        (RANDOM_ACCEPT, "accept = float(uniform_probs[flat + j]) < min(1.0, float(p[x]) / float(q[x]))"),
    ), "Accepts only when u < p/q: a draft with u exactly p/q is rejected (vLLM: target/draft >= uniform).",
        fails={"l09_boundary"},
        hint="均匀随机数恰好等于比值时接受吗？检查比较符。"),
    "uniform_of_the_first_request": Mutant(CELL, (
        (RANDOM_ACCEPT, "accept = float(uniform_probs[j]) <= min(1.0, float(p[x]) / float(q[x]))"),
    ), "Indexes the uniforms by the draft position only: every request reuses the first request's draws.",
        fails={"l09_main_path"},
        hint="每个请求的均匀随机数是怎么索引的？会不会共用？"),
    "greedy_needs_q_positive": Mutant(CELL, (
        ("accept = int(p.argmax()) == x", "accept = int(p.argmax()) == x and float(q[x]) > 0.0"),
    ), "Copies the random kernel's draft_prob > 0 guard into greedy rows: vLLM's greedy kernel never reads q.",
        fails={"l09_boundary"},
        hint="贪心行的接受条件需要看草稿分布 q 吗？"),
    "bonus_in_the_last_column": Mutant(CELL, (
        ("out[i, k] = int(bonus_token_ids[i])", "out[i, max_k] = int(bonus_token_ids[i])"),
    ), "Writes the bonus token into the batch's last column, not right after this request's k drafts.",
        fails={"l09_main_path", "l09_boundary"},
        hint="bonus token 写在哪一列？每个请求的草稿数可能不同。"),
}
