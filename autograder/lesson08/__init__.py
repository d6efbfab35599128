"""Lesson 8 (结构化输出：grammar bitmask 与 CPU/GPU 重叠): the checks (the notebook and its LESSON come with the new lesson pipeline)."""
from autograder.lesson08.checks import *  # noqa: F401,F403
