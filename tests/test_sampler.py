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


def test_cached_sampling_metadata_follows_every_batch_change():
    """The runner reuses the last SamplingMetadata while the batch is unchanged; a request leaving and another
    taking its row (same rows, new params), a swap, and min_tokens crossing its threshold all show at once."""
    import types

    import numpy as np

    from minivllm.sampling_params import SamplingParams
    from minivllm.worker.gpu_input_batch import CachedRequestState, InputBatch
    from minivllm.worker.gpu_model_runner import GPUModelRunner

    batch = InputBatch(max_num_reqs=4, max_model_len=64, block_size=16)
    runner = types.SimpleNamespace(input_batch=batch, device=torch.device("cpu"), _sampling_metadata_key=None,
                                   _cached_sampling_metadata=None)
    runner._make_sampling_metadata = lambda rows: GPUModelRunner._make_sampling_metadata(runner, rows)
    md = lambda: GPUModelRunner._sampling_metadata(runner, np.arange(batch.num_reqs))  # noqa: E731

    def state(rid, **sp):
        return CachedRequestState(rid, [5, 6, 7], SamplingParams(**sp), None, [1], 3, eos_token_id=2)

    batch.add_request(state("a", temperature=0.0))
    batch.add_request(state("b", temperature=0.7, top_k=5))
    first = md()
    assert md() is first  # unchanged batch: reused
    assert first.temperature.tolist() == [0.0, np.float32(0.7)] and first.top_k.tolist() == [0, 5]
    batch.remove_request("b")
    batch.add_request(state("c", temperature=1.3))  # the same row, other parameters
    second = md()
    assert second is not first and second.temperature.tolist() == [0.0, np.float32(1.3)] and second.top_k is None
    batch.swap_states(0, 1)
    assert md().temperature.tolist() == [np.float32(1.3), 0.0]
    batch.add_request(state("d", temperature=0.0, min_tokens=2))  # row 2, prompt of 3: below min_tokens
    assert md().min_tokens == {2: [2]}
    batch.append_token(2, 9)
    batch.append_token(2, 9)
    assert md().min_tokens is None  # two outputs now: nothing masked, with no batch change in between
    assert md().penalties is None
    batch.add_request(state("e", temperature=0.0, presence_penalty=0.5, repetition_penalty=1.2))  # row 3
    batch.append_token(3, 11)
    p = md().penalties
    assert p.presence.tolist() == [0, 0, 0, 0.5] and p.repetition.tolist() == [1, 1, 1, np.float32(1.2)]
    assert p.prompt_token_ids[3].tolist() == [5, 6, 7] and p.output_token_ids[3].tolist() == [11, -1]
    assert p.output_token_ids[2].tolist() == [9, 9]
    batch.swap_states(2, 3)  # the penalties move with their request
    assert md().penalties.presence.tolist() == [0, 0, 0.5, 0]
    batch.remove_request("e")
    assert md().penalties is None


def test_penalties_are_vllms_formulas():
    """vLLM's apply_penalties: repetition divides positive / multiplies negative logits of every token seen in the
    prompt or the output; frequency subtracts per output occurrence, presence once per output token."""
    from minivllm.sample.metadata import Penalties
    from minivllm.sample.sampler import apply_penalties

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0]])
    p = Penalties(torch.tensor([0.5]), torch.tensor([0.25]), torch.tensor([2.0]),
                  torch.tensor([[0, -1]]), torch.tensor([[1, 3, 3]]))
    out = apply_penalties(logits.clone(), p)
    # token 0: prompt only -> 2/2; token 1: output once -> -1*2 - 0.25 - 0.5; token 3: output twice -> 3/2 - 0.5 - 0.5
    assert torch.allclose(out, torch.tensor([[1.0, -2.75, 0.5, 0.5, -2.0]]))
    none = Penalties(torch.zeros(1), torch.zeros(1), torch.ones(1), torch.tensor([[0]]), torch.tensor([[1]]))
    assert torch.equal(apply_penalties(logits.clone(), none), logits)


def test_allowed_token_ids_and_logit_bias():
    """vLLM's allowed_token_ids mask and LogitBiasLogitsProcessor change what is sampled, not the raw logprobs."""
    from minivllm.sample.metadata import SamplingMetadata
    from minivllm.sample.sampler import Sampler

    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0], [5.0, 1.0, 0.0, -1.0], [5.0, 1.0, 0.0, -1.0]])
    md = SamplingMetadata(temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, min_p=None,
                          generators={}, max_num_logprobs=0, num_logprobs=[0, 0, 0],
                          allowed_token_ids={0: [2, 3]}, logit_bias={1: {3: 100.0}})
    out = Sampler()(logits, md)
    assert out.sampled_token_ids.tolist() == [2, 3, 0]
    raw = logits.log_softmax(-1)
    assert out.logprobs[0] == {2: raw[0, 2].item()}  # the raw distribution's logprob of the sampled token


def test_random_sample_cpu_rows_follow_probs_and_seeded_rows_keep_vllms_race():
    """Unseeded CPU rows go through the cumulative distribution: never a zero-probability token, and the
    frequencies follow probs (chi-square, 6000 draws). A seeded row still draws its exponential race from its
    own generator, as vLLM's random_sample does: the same token as argmax(p / q) with q from that seed."""
    from minivllm.sample.sampler import random_sample

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]] * 6000)
    torch.manual_seed(0)
    sampled = random_sample(probs, {})
    counts = torch.bincount(sampled, minlength=6).double()
    assert counts[[0, 2, 5]].sum() == 0
    expected = 6000 * probs[0]
    chi2 = ((counts - expected)[[1, 3, 4]] ** 2 / expected[[1, 3, 4]]).sum().item()
    assert chi2 < 13.8, (counts, chi2)  # 2 degrees of freedom, p = 0.001
    wrong = ((counts[[1, 3, 4]] - 2000) ** 2 / 2000).sum().item()
    assert wrong > 13.8  # the test can tell these probs from uniform ones
    seeded = {1: torch.Generator().manual_seed(7)}
    rows = random_sample(probs[:3], seeded)
    q = torch.empty(6).exponential_(generator=torch.Generator().manual_seed(7))
    assert rows[1].item() == probs[1].div(q).argmax().item()
