"""Lesson 1 — vLLM V1 源码地图. checks.py: how each part is graded; demo.py: what the notebook shows;
mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson01.checks import *  # noqa: F403
from autograder.lesson01.checks import LESSON  # noqa: F401
from autograder.lesson01.demo import *  # noqa: F403
