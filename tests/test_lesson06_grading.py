"""Lesson 6's grader: the solution earns 4/4 code points, the unfilled release 0 without crashing, every mutant
loses points (the bounds-checked launcher turns a wild pointer into a failed check); the engine plug restores
the backend; the profiler paths (interpreter counts, the GPU bandwidth code) run; nbgrader agrees end to end
(the notebook's own run is test_autograder's). Under TRITON_INTERPRET=1 (conftest) on CPU."""
import json
import subprocess
import sys
import time

import pytest
import torch

from autograder.common import REPO
from autograder.lesson06 import (
    OpCounter,
    check_source_map,
    gpu_portability_problems,
    interpreter_profile,
    make_case,
    measure_bandwidth,
    plot_roofline,
    print_bandwidth,
    reference,
    run_decode,
    run_engine,
)
from autograder.mutation import mutant_namespace, mutants

pytestmark = pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1"
                                and not torch.cuda.is_available(), reason="Triton needs CUDA or TRITON_INTERPRET=1")


def mutant(name):
    return mutant_namespace("lesson06", name)["paged_decode_kernel"]


def test_mutants_change_only_blank_lines():
    """A mutant is a wrong answer a student could give: every solution line it edits is a blank line."""
    sol = json.loads((REPO / "solutions/lesson06/lesson06.ipynb").read_text(encoding="utf-8"))
    kernel = next("".join(c["source"]) for c in sol["cells"] if c["id"] == "l06_kernel")
    blank_lines = {line.split("  ### BLANK")[0] for line in kernel.splitlines() if "### BLANK" in line}
    for name, m in mutants("lesson06").items():
        for old, new in m.edits:
            changed = set(old.splitlines()) - set(new.splitlines())
            assert 1 <= len(changed) <= 4 and changed <= blank_lines, (name, changed)


def test_gpu_only_mistakes_are_caught_statically_though_the_interpreter_computes_them_right(solution_ns):
    """The interpreter ignores input_precision and computes tl.dot in fp32, so these two answers are numerically
    right on the CPU; only the static check of their tl.dot calls stops them (a GPU uses tf32 / fails to compile)."""
    import autograder.lesson06.checks as L06

    assert gpu_portability_problems(solution_ns["paged_decode_kernel"]) == []
    case = make_case([5, 16, 17, 40], seed=0)
    for name, word in (("dot_default_precision", "input_precision"), ("probs_not_cast", "COMPUTE_DTYPE")):
        kernel = mutant(name)
        problems = gpu_portability_problems(kernel)
        assert len(problems) == 1 and word in problems[0], problems
        original = L06.gpu_portability_problems
        L06.gpu_portability_problems = lambda k: []
        try:
            out = run_decode(kernel, case)
        finally:
            L06.gpu_portability_problems = original
        assert (out - reference(case)).abs().max().item() < 1e-4


def test_no_max_subtraction_is_exact_on_small_scores_and_nan_on_big_ones():
    """Why the boundary check needs big logits: the missing max is invisible on ordinary inputs."""
    k = mutant("no_max_subtraction")
    small = make_case([20, 37], seed=6)
    assert (run_decode(k, small) - reference(small)).abs().max() < 1e-4
    hot = make_case([20, 37], q_scale=200.0, seed=6)
    assert torch.isnan(run_decode(k, hot)).any()


def test_wild_pointer_fails_cleanly_in_a_fresh_process():
    """The launcher's bounds check turns an out-of-bounds load into a CheckFailed: the process survives."""
    code = ("from autograder import lesson06 as L\nfrom autograder.mutation import mutant_namespace\n"
            "k = mutant_namespace('lesson06', 'block_table_wrong_stride')['paged_decode_kernel']\n"
            "try:\n    L.run_decode(k, L.make_case([5, 40]))\nexcept AssertionError as e:\n    print('CAUGHT', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(__import__("os").environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CAUGHT 内核访问越界" in proc.stdout, proc.stdout


def test_engine_plug_restores_the_backend_and_logs_every_decode_call():
    import minivllm.attention.backends.triton_attn as backend

    original = backend.paged_decode_attention
    with pytest.raises(AssertionError):
        run_engine(mutant("block_table_wrong_stride"))
    assert backend.paged_decode_attention is original
    run = run_engine(mutant("no_acc_rescale"))
    assert backend.paged_decode_attention is original
    assert len(run.calls) == 4 * 5                       # 4 layers x 5 decode steps (6 tokens, 1 from prefill)
    assert [c.seq_lens for c in run.calls[::4]] == [[15, 7], [16, 8], [17, 9], [18, 10], [19, 11]]
    assert max(c.max_err for c in run.calls[:8]) < 1e-4  # one block: no rescale needed yet
    assert max(c.max_err for c in run.calls[8:]) > 1e-4  # r0 crosses into its second block at seq_len 17


def test_interpreter_counts_show_reads_once_and_the_gqa_saving():
    from minivllm.attention.ops.triton_decode_attention import _paged_decode_attention_kernel

    case, grouped, per_head, minimum = interpreter_profile(_paged_decode_attention_kernel)
    kv = lambda c: c.load_bytes["k_cache"] + c.load_bytes["v_cache"]  # noqa: E731
    assert kv(grouped) == minimum and kv(per_head) == 4 * minimum
    assert grouped.load_bytes["k_cache"] == grouped.load_bytes["v_cache"]
    assert grouped.programs == 4 and per_head.programs == 16 and grouped.stores["out"] == case.query.numel()
    masked = OpCounter()
    run_decode(mutant("no_mask_last_block"), case, masked)   # 40 = 2.5 blocks: the tail of block 3 is read
    assert kv(masked) == minimum * 48 // 40


def test_gpu_bandwidth_code_path_runs_on_cpu():
    """measure_bandwidth / plot_roofline are what a GPU run executes; here with a wall-clock bench, tiny shapes."""
    from minivllm.attention.ops.triton_decode_attention import _paged_decode_attention_kernel

    def wall(fn):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    res = measure_bandwidth(_paged_decode_attention_kernel, batch_sizes=(1,), context=20, num_heads=4,
                            num_kv_heads=2, head_size=32, dtype=torch.float32, bench=wall)
    (row,) = res["rows"]
    print_bandwidth(res)
    assert row["gbs"] > 0 and row["ai"] == pytest.approx(4 * 2 / (2 * 4), rel=0.05)
    fig = plot_roofline([("B=1", row["ai"], row["tflops"])], res["peak_tflops"], res["copy_gbs"] / 1e3, "cpu")
    assert fig.axes[0].get_title(loc="left").endswith("(measured points in red)")


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"`{v}`" for k, v in good.items()})
    check_source_map(dict(good, physical_block="physical_block_idx", token_mask="tile_mask", probs="P",
                          running_sum="kernel_paged_attention_2d.L"))
    check_source_map(dict(good, token_mask="seq_mask"))   # the same mask, as the scores see it (L214)
    for bad in (dict(good, probs=good["rescale"], rescale=good["probs"]), dict(good, running_sum="M"),
                {k: v for k, v in good.items() if k != "physical_block"}, dict(good, physical_block="l_block_idx"),
                dict(good, probs=None)):
        with pytest.raises(AssertionError):
            check_source_map(bad)


def test_student_copy_shows_the_blanks():
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((REPO / "notebooks/lesson06/lesson06.ipynb").read_text(encoding="utf-8"))["cells"]}
    kernel = cells["l06_kernel"]
    assert kernel.count("= ______\n") == 6 and "### BLANK" not in kernel
    assert "physical_block = ______\n        physical_block = physical_block.to(tl.int64)" in kernel
    assert "tl.store(out_ptr + out_offsets" in kernel and "mask=head_mask[:, None] & dim_mask[None, :])" in kernel
    assert "kv_offsets = (physical_block * stride_cache_block" in kernel   # given: the K/V address is not a blank
    assert "new_max = tl.maximum(running_max, block_max)\n" in kernel
    assert "assert torch.allclose(out, ref, atol=1e-4)" in cells["l06_main_path"]


_AOT_SCRIPT = """
import sys, importlib.util
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
spec = importlib.util.spec_from_file_location("student_kernel", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
kernel = mod.paged_decode_kernel
names = kernel.arg_names
const = dict(QUERIES_PER_KV=4, GROUP_PAD=16, HEAD_DIM_PAD=128, BLOCK_SIZE=16, COMPUTE_DTYPE=tl.bfloat16,
             DOT_PRECISION="tf32")
types = {"block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "scale": "fp32"}
sig = {n: "constexpr" if n in const else types.get(n, "*bf16" if n.endswith("_ptr") else "i32") for n in names}
div16 = [n for n in names if sig[n] != "constexpr" and (n.endswith("_ptr") or sig[n] == "i32")]
src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in const.items()},
                attrs={(names.index(n),): [["tt.divisibility", 16]] for n in div16})
triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run compiles the kernel for real")
def test_solution_kernel_compiles_for_sm90_without_a_gpu(tmp_path):
    """'On GPU unchanged': the notebook's kernel cell, as a student completes it, compiles for an H100/H200."""
    import os

    sol = json.loads((REPO / "solutions/lesson06/lesson06.ipynb").read_text(encoding="utf-8"))
    kernel = next("".join(c["source"]) for c in sol["cells"] if c["id"] == "l06_kernel")
    path = tmp_path / "student_kernel.py"
    path.write_text(kernel.replace("  ### BLANK", ""), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _AOT_SCRIPT, str(path)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
