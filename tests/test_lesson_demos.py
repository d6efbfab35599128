"""The notebook demos that compare minivllm with vLLM: lesson 5's Model Runner V2 bookkeeping (slot table +
idx_mapping) and lesson 4's captions, on hand-built inputs (no engine run)."""
from types import SimpleNamespace

import pytest

from autograder.lesson04.demo import caption_swimlane, preemption_summary
from autograder.lesson05.demo import BatchStep, v2_tables
from minivllm.core.sched.output import CachedRequestData, SchedulerOutput


def _so(scheduled, new=(), finished=(), preempted=(), resumed=()):
    cached = CachedRequestData(req_ids=[r for r in scheduled if r not in new],
                               resumed_from_preemption=[r in resumed for r in scheduled if r not in new])
    return SchedulerOutput(scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new],
                           scheduled_cached_reqs=cached, num_scheduled_tokens=dict(scheduled),
                           total_num_scheduled_tokens=sum(scheduled.values()),
                           finished_req_ids=set(finished), preempted_req_ids=set(preempted))


def test_v2_slots_are_lifo_and_kept_until_finish_and_batches_put_decodes_first():
    log = [BatchStep(_so({"a": 16, "b": 8}, new=("a", "b"))),
           BatchStep(_so({"a": 1, "b": 6})),
           BatchStep(_so({"b": 1, "c": 5}, new=("c",), finished=("a",))),
           BatchStep(_so({"b": 1, "c": 1}, preempted=())),
           BatchStep(_so({"c": 1}, preempted=("b",))),
           BatchStep(_so({"b": 7, "c": 1}, resumed=("b",)))]
    tables = v2_tables(log, max_num_reqs=4)
    # free_indices.pop(): the first request takes the last slot; a freed slot is the next one handed out
    assert tables[0] == ({3: "a", 2: "b"}, ["b", "a"], [2, 3])       # non-decodes by token count
    assert tables[1] == ({3: "a", 2: "b"}, ["a", "b"], [3, 2])       # the decode first; slots unchanged
    assert tables[2] == ({3: "c", 2: "b"}, ["b", "c"], [2, 3])       # a finished: c reuses slot 3
    assert tables[4][0] == {3: "c"}                                   # b preempted: its slot is freed
    assert tables[5] == ({3: "c", 2: "b"}, ["c", "b"], [3, 2])       # b resumed into the freed slot


def _run(preempted, aborted_in, num_steps):
    return SimpleNamespace(life=SimpleNamespace(preempted=preempted, aborted_in=aborted_in),
                           num_preemptions=sum(map(len, preempted)), num_steps=num_steps)


def test_lesson04_caption_says_what_the_run_showed():
    plain = _run([[], ["w"], [], ["d"], ["d"]], {}, 5)
    aborted = _run([["w"], [], [], ["w"], ["z"]], {"d": (2, "RUNNING"), "w": (4, "PREEMPTED")}, 5)
    s = preemption_summary(aborted)
    assert s["per_request"] == {"w": [1, 4], "z": [5]} and s["last_abort"] == 4 and s["after_last_abort"] == [5]
    text = caption_swimlane([plain, aborted])
    assert "共 3 次抢占——d 2 次（第 4、5 步），w 1 次（第 2 步）" in text
    assert "最后一次取消（第 4 步）之后还有 1 次抢占" in text
    quiet = caption_swimlane([plain, _run([["w"]], {"w": (3, "WAITING")}, 3)])
    assert "之后没有再发生抢占" in quiet


def test_lesson09_vllm_side_matches_the_solution_from_the_recording(capsys):
    """Lesson 9's side-by-side (the pinned vLLM's recorded rejection_sample): every forced batch equal, the shared
    uniforms give the same accepted counts."""
    from autograder.common import REPO, student_namespace
    from autograder.lesson09.demo import vllm_side_by_side

    ns, errors = student_namespace(REPO / "solutions/lesson09/lesson09.ipynb")
    assert not errors
    shown = vllm_side_by_side(ns["rejection_sample"])
    out = capsys.readouterr().out
    assert "读取录制结果" in out and "DIFFERENT" not in out
    assert sum(line.rstrip().endswith("=") for line in out.splitlines()) == 12
    hist = shown["vllm"]["distribution"]["accepted_hist"]
    assert f"vLLM {hist}, yours {hist}" in out


def _from_recording(monkeypatch, lesson_id, name=None):
    """The lesson's answer cells (solution, or a mutant), with vLLM's side read from the recording."""
    from autograder.common import REPO, student_namespace
    from autograder.mutation import mutant_namespace

    monkeypatch.setenv("MINIVLLM_VLLM_PYTHON", str(REPO / "no-such-venv" / "python"))
    if name:
        return mutant_namespace(lesson_id, name)
    ns, errors = student_namespace(REPO / f"solutions/{lesson_id}/{lesson_id}.ipynb")
    assert not errors
    return ns


def test_lesson07_vllm_view_shows_the_recorded_sampler_beside_yours(monkeypatch, capsys):
    import torch

    from autograder.lesson07.demo import vllm_side_by_side

    ns = _from_recording(monkeypatch, "lesson07")
    row = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3   # not the lesson's row: stages differ
    vllm_side_by_side(row, ns["apply_min_p"], ns["apply_top_k_top_p"], ns["sample"])
    out = capsys.readouterr().out
    assert "读取录制结果 data/vllm_views/lesson07.json.xz" in out and "minivllm 不同" in out
    batch = out.split("评分批 grade_mixed")[1].splitlines()[2:]
    assert len(batch) == 8 and all(line.endswith("✓") for line in batch)
    bad = _from_recording(monkeypatch, "lesson07", "seeded_noise_from_log_uniform")
    vllm_side_by_side(row, bad["apply_min_p"], bad["apply_top_k_top_p"], bad["sample"])
    assert "✗" in capsys.readouterr().out.split("评分批 grade_mixed")[1]


def test_lesson08_vllm_view_reorders_vllms_rows_and_walks_to_eos(monkeypatch, capsys):
    from autograder.lesson08.demo import vllm_side_by_side

    ns = _from_recording(monkeypatch, "lesson08")
    vllm_side_by_side(ns["choice_bitmask"])
    out = capsys.readouterr().out
    assert "读取录制结果 data/vllm_views/lesson08.json.xz" in out and "逐字相同：✓" in out and "✗" not in out
    assert "accept_tokens 接受：True" in out and out.count("✓") == 1 + 6      # one batch, six steps to EOS
    bad = _from_recording(monkeypatch, "lesson08", "rows_in_scheduler_order")
    bad.setdefault("torch", __import__("torch"))
    vllm_side_by_side(bad["choice_bitmask"])
    assert "逐字相同：✗" in capsys.readouterr().out


def test_lesson11_vllm_side_shows_the_decode_graphs_from_the_recording(capsys):
    """Lesson 11's side-by-side: with max_num_seqs 20, vLLM's full decode graphs stop at 16 (17..20 eager) while
    minivllm adds 20; the solution's choose_capture_size follows vLLM's column."""
    from autograder.lesson11.demo import vllm_side_by_side

    def choose(n, sizes):
        fits = [s for s in sizes if s >= n]
        return min(fits) if fits else None

    shown = vllm_side_by_side(choose)
    out = capsys.readouterr().out
    assert "读取录制结果" in out
    assert shown["minivllm"]["default_20_seqs"] == [1, 2, 4, 8, 16, 20]
    rows = {int(line.split()[0]): line.split()[1:] for line in out.splitlines() if line[:1].isdigit()}
    assert rows[17] == ["20", "eager", "eager"] and rows[9] == ["16", "16", "16"]


def test_lesson12_vllm_side_matches_the_solution_from_the_recording(capsys):
    """Lesson 12's side-by-side (the pinned vLLM's recorded IncrementalDetokenizer): every stream equal to the solution's,
    the hold-back visible as empty first deltas."""
    from autograder.common import REPO, student_namespace
    from autograder.lesson12.demo import vllm_side_by_side

    ns, errors = student_namespace(REPO / "solutions/lesson12/lesson12.ipynb")
    assert not errors
    shown = vllm_side_by_side(ns["StreamingDetokenizer"])
    out = capsys.readouterr().out
    assert "读取录制结果" in out and "DIFFERENT" not in out
    assert shown["yours"] == shown["vllm"]
    assert shown["vllm"]["stop_across_steps"]["events"][:2] == [[None, ""], [None, ""]]


@pytest.mark.slow  # ~10 s: one minivllm engine at block size 16
def test_lesson05_vllm_cpu_runner_prepares_the_same_arrays_per_request(monkeypatch):
    """The pinned vLLM's CPUModelRunner (recorded) and minivllm's runner on the lesson's workload at block size 16:
    every request's tokens, positions, seq_len and slots equal at every step; the deliberate differences show
    (minivllm puts decodes first, vLLM also takes logits of mid-prompt chunks)."""
    from autograder.common import REPO
    from autograder.lesson05.demo import vllm_side_by_side

    monkeypatch.setenv("MINIVLLM_VLLM_PYTHON", str(REPO / "no-such-venv" / "python"))
    rows = vllm_side_by_side()
    assert len(rows) == 17 and all(same and slots for same, slots, _, _ in rows)
    assert rows[0][2:] == (["0", "1"], []) and rows[2][2:] == (["0", "1"], ["1", "0"])
    assert all(sorted(v) == sorted(m) for _, _, v, m in rows[2:])


def test_lesson10_vllm_side_tp1_slices_match_minivllm_from_the_recording(capsys):
    """Lesson 10: minivllm's TP=1 layer 0 and embedding hold the checkpoint slices the pinned vLLM's own layers
    recorded (TP=2's ranks run in the notebook: two worker processes, too slow here); the side-by-side prints
    them from the recording."""
    from autograder.lesson10.demo import DEFAULT_MODEL, _rank_shapes, vllm_side_by_side
    from autograder.vllm_oracle import recorded

    vllm = recorded("lesson10", "layer0_and_embedding")
    mine = _rank_shapes(0, DEFAULT_MODEL)
    assert mine["slices"] == {k: x["source"] for k, x in vllm["tp1_rank0"].items()}
    fake = {"tp2": {r: {"shapes": {("model.embed_tokens.weight" if k == "embed_tokens" else f"model.layers.0.{k}.weight"):
                                   tuple(x["shape"]) for k, x in vllm[f"tp2_rank{r}"].items()},
                        "slices": {k: x["source"] for k, x in vllm[f"tp2_rank{r}"].items()}} for r in (0, 1)}}
    assert vllm_side_by_side(fake)["same_shapes"]
    out = capsys.readouterr().out
    assert "读取录制结果" in out and "q_proj[128:256] + k_proj[32:64] + v_proj[32:64] rows" in out


def test_lesson06_vllm_cpu_attention_equals_the_torch_reference_and_the_kernel(monkeypatch, capsys):
    """The pinned vLLM's CPU attention op (recorded) on the lesson's paged decode batches: within float32 rounding of
    minivllm's torch reference and of minivllm's Triton kernel (interpreter on CPU)."""
    from autograder.common import REPO
    from autograder.lesson06.demo import vllm_side_by_side
    from minivllm.attention.ops.triton_decode_attention import _paged_decode_attention_kernel

    monkeypatch.setenv("MINIVLLM_VLLM_PYTHON", str(REPO / "no-such-venv" / "python"))
    shown = vllm_side_by_side(_paged_decode_attention_kernel)
    assert set(shown) == {"lesson", "long_gqa"} and all(e < 1e-5 for errs in shown.values() for e in errs)
    assert "读取录制结果 data/vllm_views/lesson06.json.xz" in capsys.readouterr().out
