"""Lesson 3 — BlockPool 与 Prefix Caching. checks.py: how each part is graded; demo.py: what the notebook shows;
mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson03.checks import *  # noqa: F403
from autograder.lesson03.checks import LESSON  # noqa: F401
from autograder.lesson03.demo import *  # noqa: F403
