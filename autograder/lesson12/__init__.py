"""Lesson 12 — 前端与在线服务：AsyncLLM、ZMQ/msgspec、SSE 与基准测试. checks.py: how each part is graded;
demo.py: what the notebook shows; mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson12.checks import *  # noqa: F403
from autograder.lesson12.checks import LESSON  # noqa: F401
from autograder.lesson12.demo import *  # noqa: F403
