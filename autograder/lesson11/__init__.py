"""Lesson 11 — CUDA Graph 与动态形状. checks.py: how each part is graded; demo.py: what the notebook shows;
mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson11.checks import *  # noqa: F403
from autograder.lesson11.checks import LESSON  # noqa: F401
from autograder.lesson11.demo import *  # noqa: F403
