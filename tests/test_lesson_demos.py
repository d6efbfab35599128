"""The notebook demos that compare minivllm with vLLM: lesson 5's Model Runner V2 bookkeeping (slot table +
idx_mapping) and lesson 4's captions, on hand-built inputs (no engine run)."""
from types import SimpleNamespace

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
