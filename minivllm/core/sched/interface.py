"""SchedulerInterface: the contract EngineCore relies on (vLLM: v1/core/sched/interface.py)."""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable

from minivllm.core.sched.output import GrammarOutput, SchedulerOutput
from minivllm.engine import EngineCoreOutputs
from minivllm.metrics.stats import SchedulerStats
from minivllm.request import Request, RequestStatus
from minivllm.worker.outputs import ModelRunnerOutput


class PauseState(enum.IntEnum):
    """vLLM's scheduler pause states (v1/core/sched/interface.py:24): PAUSED_NEW schedules only the running
    requests (new ones wait), PAUSED_ALL schedules nothing."""

    UNPAUSED = 0
    PAUSED_NEW = 1
    PAUSED_ALL = 2


class SchedulerInterface(ABC):
    """schedule() -> SchedulerOutput; the worker runs it; update_from_output() applies the result."""

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Decide which requests run this step and how many tokens each computes, within the budget."""

    @abstractmethod
    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The step's grammar phase: bitmask rows of the constrained requests that sample, or None."""

    @abstractmethod
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """Append sampled tokens, check stop conditions, free finished requests, emit outputs."""

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new request as WAITING."""

    @abstractmethod
    def finish_requests(self, request_ids: str | Iterable[str], finished_status: RequestStatus) -> None:
        """End requests from outside the step (aborts); their blocks are freed at once."""

    @abstractmethod
    def get_num_unfinished_requests(self) -> int:
        """Waiting + running."""

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    @abstractmethod
    def has_finished_requests(self) -> bool:
        """Finished ids not yet reported to the worker (it must still free their state)."""

    def has_requests(self) -> bool:
        """Whether step() has anything to do: unfinished requests, or finished ids to report."""
        return self.has_unfinished_requests() or self.has_finished_requests()

    @abstractmethod
    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """Forget cached blocks; False while requests hold blocks (reset_running_requests: preempt them first)."""

    @abstractmethod
    def make_stats(self) -> SchedulerStats | None:
        """A snapshot for metrics."""
