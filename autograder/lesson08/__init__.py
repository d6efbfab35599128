"""Lesson 8 (结构化输出：grammar bitmask 与 CPU/GPU 重叠): checks (how each part is graded) and demo (what the notebook shows)."""
from autograder.lesson08.checks import *  # noqa: F401,F403
from autograder.lesson08.checks import LESSON  # noqa: F401
from autograder.lesson08.demo import *  # noqa: F401,F403
