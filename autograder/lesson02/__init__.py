"""Lesson 2 — 统一调度器与 KVCacheManager. checks.py: how each part is graded; demo.py: what the notebook shows;
mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson02.checks import *  # noqa: F403
from autograder.lesson02.checks import LESSON  # noqa: F401
from autograder.lesson02.demo import *  # noqa: F403
