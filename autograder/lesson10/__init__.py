"""Lesson 10 — 分布式执行：张量并行、Executor 与 all-reduce. checks.py: how the code parts are graded
(two forked gloo ranks; the student's layers patched into minivllm's Llama at TP=2)."""
from autograder.lesson10.checks import *  # noqa: F403
