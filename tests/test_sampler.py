"""Sampler ops against a sort-based reference; the top-k-only fast path must not sort (profiler)."""
import torch
from torch.profiler import ProfilerActivity, profile

from minivllm.sample.sampler import apply_top_k_only, apply_top_k_top_p


def sort_reference(logits, k):
    """Top-k by the full descending sort: keep every token >= the k-th largest (ties kept)."""
    out = logits.clone()
    for i, ki in enumerate(k.tolist()):
        if 0 < ki < logits.shape[1]:
            kth = logits[i].sort(descending=True).values[ki - 1]
            out[i][logits[i] < kth] = float("-inf")
    return out


def ops_of(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


def test_top_k_only_equals_sort_reference_with_ties_and_off_rows():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=g)
    logits[1] = logits[1].clamp(max=2.0)
    logits[1, :5] = 3.0                                     # a tie at the k-th value: all tied tokens stay
    k = torch.tensor([1, 3, 0, 40, 17, 5])                  # 0 and vocab: off
    torch.testing.assert_close(apply_top_k_only(logits, k), sort_reference(logits, k))
    torch.testing.assert_close(apply_top_k_top_p(logits, k, None), sort_reference(logits, k))
    assert torch.isfinite(apply_top_k_only(logits, k)[1]).sum() == 5


def test_sort_only_when_a_row_uses_top_p():
    logits = torch.randn(4, 64)
    k = torch.tensor([5, 0, 10, 3])
    assert "aten::sort" not in ops_of(lambda: apply_top_k_top_p(logits, k, None))
    assert "aten::sort" in ops_of(lambda: apply_top_k_top_p(logits, k, torch.tensor([0.9, 1.0, 1.0, 1.0])))
