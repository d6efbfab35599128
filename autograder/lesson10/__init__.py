"""Lesson 10 — 分布式执行：张量并行、Executor 与 all-reduce. checks.py: how each part is graded (two gloo
ranks forked from a forkserver; the student's layers patched into minivllm's Llama at TP=2 in a helper started
the same way); demo.py: what the notebook shows; mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson10.checks import *  # noqa: F403
from autograder.lesson10.checks import LESSON  # noqa: F401
from autograder.lesson10.demo import *  # noqa: F403
