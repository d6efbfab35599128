"""Lesson 6 — PagedAttention：Triton decode kernel. checks.py: how each part is graded; demo.py: what the notebook shows;
mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson06.checks import *  # noqa: F403
from autograder.lesson06.checks import LESSON  # noqa: F401
from autograder.lesson06.demo import *  # noqa: F403
