"""Lesson 7 — 采样器：temperature、top-k/top-p、种子与 logprobs. checks.py: how each part is graded; demo.py: what
the notebook shows; mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson07.checks import *  # noqa: F403
from autograder.lesson07.checks import LESSON  # noqa: F401
from autograder.lesson07.demo import *  # noqa: F403
