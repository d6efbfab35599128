"""The lessons' "在真实 vLLM 上看同一件事" sections and vLLM-graded parts (autograder/vllm_oracle): every
lesson has a vLLM side, its recording answers exactly today's inputs, and (make test-vllm) vLLM re-answers them
identically live."""
from __future__ import annotations

import os

import pytest

from autograder import vllm_oracle
from autograder.pin import VLLM_VERSION

LIVE = os.environ.get("MINIVLLM_VLLM_LIVE") == "1"


def test_every_lesson_has_a_vllm_side():
    from autograder.common import discover_lessons

    missing = sorted(set(discover_lessons()) - set(vllm_oracle.LESSONS))
    assert not missing, f"no autograder/<lesson>/vllm_view.py (and its recording) for {missing}"


@pytest.mark.parametrize("lesson", vllm_oracle.LESSONS)
def test_recording_answers_todays_inputs(lesson):
    rec = vllm_oracle.load_recording(lesson)
    assert rec["header"]["vllm_version"] == VLLM_VERSION
    cases = vllm_oracle.scenarios(lesson)
    assert cases, f"{lesson} has no scenario"
    assert rec["header"]["digests"] == {n: vllm_oracle.digest(p) for n, p in cases.items()}
    assert set(rec["answers"]) == set(cases)
    assert vllm_oracle.check(lesson) == []


def test_a_stale_recording_is_refused(monkeypatch):
    lesson = vllm_oracle.LESSONS[0]
    name = next(iter(vllm_oracle.scenarios(lesson)))
    monkeypatch.setattr(vllm_oracle, "scenarios", lambda _: {name: {"changed": True}})
    with pytest.raises(RuntimeError, match="other inputs"):
        vllm_oracle.recorded(lesson, name)


@pytest.mark.skipif(not LIVE, reason="live: MINIVLLM_VLLM_LIVE=1 and .venv-vllm (make test-vllm)")
@pytest.mark.parametrize("lesson", vllm_oracle.LESSONS)
def test_live_vllm_equals_recording(lesson):
    assert vllm_oracle.vllm_python() is not None, "MINIVLLM_VLLM_LIVE=1 needs .venv-vllm: run `make vllm`"
    assert vllm_oracle.check_live(lesson) == []
