"""Lesson 5 — GPUModelRunner：持久批与 varlen 输入准备. checks.py: how each part is graded; demo.py: what the
notebook shows; mutants.py: wrong answers the checks must reject (instructor side only)."""
from autograder.lesson05.checks import *  # noqa: F403
from autograder.lesson05.checks import LESSON  # noqa: F401
from autograder.lesson05.demo import *  # noqa: F403
