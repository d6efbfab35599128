"""Lesson 11 — CUDA Graph 与动态形状 (started: checks and demo; the notebook and its pipeline wiring come later)."""
from autograder.lesson11.checks import *  # noqa: F401,F403
from autograder.lesson11.demo import *  # noqa: F401,F403
