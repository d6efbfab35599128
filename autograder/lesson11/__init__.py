"""Lesson 11 — CUDA Graph 与动态形状 (started: checks only; the notebook and its pipeline wiring come later)."""
from autograder.lesson11.checks import *  # noqa: F401,F403
