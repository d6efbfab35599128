"""Lesson 4 — 抢占、取消与请求生命周期. checks.py: how each part is graded; demo.py: what the notebook shows;
mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson04.checks import *  # noqa: F403
from autograder.lesson04.checks import LESSON  # noqa: F401
from autograder.lesson04.demo import *  # noqa: F403
