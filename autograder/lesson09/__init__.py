"""Lesson 9 — 投机解码：n-gram 提议与拒绝采样. checks.py: how each part is graded; demo.py: what the notebook
shows; mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson09.checks import *  # noqa: F403
from autograder.lesson09.checks import LESSON  # noqa: F401
from autograder.lesson09.demo import *  # noqa: F403
