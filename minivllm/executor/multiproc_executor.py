"""MultiprocExecutor (vLLM: v1/executor/multiproc_executor.py): one spawned worker process per TP rank.

Each call is pickled once and broadcast to every worker (vLLM's rpc_broadcast_mq; here the same bytes
written to one pipe per worker). All ranks run the same method in lock step, so their collectives meet;
only the output rank (0) answers execute_model / sample_tokens, as in vLLM. Every rank samples the same
token from the same gathered logits, so each keeps its own copy of the batch in step.

Faults. A worker that raises sends its traceback whatever its rank (vLLM answers only from the output
rank); a worker that dies closes its process sentinel. Either way the ranks' collectives are out of step
for good, so the executor kills every worker and raises EngineDeadError: in-process that reaches the
caller, in an EngineCoreProc it kills the core, whose client then fails every request the same way.
Workers hold the read end of a death pipe and exit when it closes (the parent died), so none is orphaned.

Workers are spawned; MINIVLLM_WORKER_MULTIPROC_METHOD=fork (vLLM: VLLM_WORKER_MULTIPROC_METHOD) forks
them instead, so they inherit what this process changed in memory (a lesson's own layer classes patched
into the model). A forked worker closes the parent's pipe ends it inherited, or no pipe would ever EOF.

Differs from vLLM: pipes instead of the shared-memory MessageQueue; spawn is the default (vLLM forks
unless CUDA is already initialized); a single host (the rendezvous address and port are configurable,
but nothing starts ranks on another host).
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass

from minivllm import envs
from minivllm.config import VllmConfig
from minivllm.distributed.parallel_state import check_port_free, get_distributed_init_method, get_open_port
from minivllm.engine.exceptions import EngineDeadError
from minivllm.executor.abstract import Executor

READY, SUCCESS, FAILURE = "READY", "SUCCESS", "FAILURE"
STARTUP_TIMEOUT_S = envs.MINIVLLM_WORKER_READY_TIMEOUT_S
EXECUTE_MODEL_TIMEOUT_S = envs.MINIVLLM_EXECUTE_MODEL_TIMEOUT_S


@dataclass
class WorkerProcHandle:
    """The parent's side of one worker: its process and the pipe ends it keeps."""

    rank: int
    proc: multiprocessing.process.BaseProcess
    rpc_writer: multiprocessing.connection.Connection
    response_reader: multiprocessing.connection.Connection
    death_writer: multiprocessing.connection.Connection


class FutureWrapper:
    """execute_model(non_block=True)'s handle: the answer is read from the output rank on result()."""

    def __init__(self, get_response) -> None:
        self._get_response, self._done, self._result = get_response, False, None

    def result(self, timeout: float | None = None):
        if not self._done:
            self._result, self._done = self._get_response(), True
        return self._result


class MultiprocExecutor(Executor):
    """Starts tensor_parallel_size workers, broadcasts each call, returns the output rank's answer."""

    def __init__(self, vllm_config: VllmConfig, tracer=None) -> None:
        self.vllm_config = vllm_config
        pc = vllm_config.parallel_config
        self.world_size = pc.world_size
        self.output_rank = 0
        self.is_failed = False
        self.shutting_down = False
        _check_devices(vllm_config)
        if pc.master_port:
            check_port_free(pc.master_addr, pc.master_port)
        port = pc.master_port or get_open_port(pc.master_addr)
        init_method = get_distributed_init_method(pc.master_addr, port)
        ctx = multiprocessing.get_context(envs.MINIVLLM_WORKER_MULTIPROC_METHOD)
        self.workers: list[WorkerProcHandle] = []
        self._finalizer = weakref.finalize(self, _terminate_workers, self.workers)
        try:
            for rank in range(self.world_size):
                self.workers.append(_make_worker_process(ctx, vllm_config, rank, init_method, self.workers))
            self._wait_for_ready()
        except BaseException:
            self.shutdown()
            raise

    def _wait_for_ready(self) -> None:
        """Every worker says READY (model loaded, group joined), or startup fails with its traceback."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for w in self.workers:
            while not w.response_reader.poll(0.1):
                if not w.proc.is_alive():
                    raise RuntimeError(f"tensor-parallel worker rank {w.rank} {exit_description(w.proc)} "
                                       "during start-up; its traceback is above")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tensor-parallel worker rank {w.rank} not ready within "
                                       f"{STARTUP_TIMEOUT_S:.0f} s (MINIVLLM_WORKER_READY_TIMEOUT_S)")
            status, payload = w.response_reader.recv()
            if status != READY:
                raise RuntimeError(f"tensor-parallel worker rank {w.rank} failed to start:\n{payload}")

    # ------------------------------------------------------------------ RPC
    def collective_rpc(self, method: str, args: tuple = (), non_block: bool = False,
                       unique_reply_rank: int | None = None, timeout: float | None = None):
        """Run worker.method(*args) on every rank; all answers, or only unique_reply_rank's."""
        if self.is_failed:
            raise EngineDeadError("a tensor-parallel worker failed earlier; restart the engine")
        message = pickle.dumps((method, args, unique_reply_rank), protocol=pickle.HIGHEST_PROTOCOL)
        for w in self.workers:
            try:
                w.rpc_writer.send_bytes(message)
            except OSError as e:
                self._fail(f"could not reach worker rank {w.rank} ({e}): it {exit_description(w.proc)}")
        ranks = [unique_reply_rank] if unique_reply_rank is not None else list(range(self.world_size))
        deadline = time.monotonic() + (timeout or EXECUTE_MODEL_TIMEOUT_S)
        future = FutureWrapper(lambda: self._get_responses(method, ranks, deadline, unique_reply_rank is not None))
        return future if non_block else future.result()

    def _get_responses(self, method: str, ranks: list[int], deadline: float, single: bool):
        """Wait for the answering ranks; any worker's death or FAILURE message fails the executor at once."""
        results: dict[int, object] = {}
        while len(results) < len(ranks):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(f"{method} got no answer within the timeout (MINIVLLM_EXECUTE_MODEL_TIMEOUT_S)")
            ready = multiprocessing.connection.wait([w.response_reader for w in self.workers]
                                                    + [w.proc.sentinel for w in self.workers], remaining)
            for w in self.workers:
                if w.response_reader in ready:
                    try:
                        status, payload = w.response_reader.recv()
                    except (EOFError, OSError):
                        self._fail(f"worker rank {w.rank} {exit_description(w.proc)} during {method}")
                    if status != SUCCESS:
                        self._fail(f"worker rank {w.rank} raised in {method}:\n{payload}")
                    results[w.rank] = payload
                elif w.proc.sentinel in ready:
                    self._fail(f"worker rank {w.rank} {exit_description(w.proc)} during {method}")
        return results[ranks[0]] if single else [results[r] for r in ranks]

    def _fail(self, reason: str):
        self.is_failed = True
        print(f"MultiprocExecutor: {reason}; shutting down every worker.", file=sys.stderr)
        self.shutdown()
        raise EngineDeadError(f"tensor-parallel {reason}")

    # ------------------------------------------------------------------ the Executor interface
    def determine_num_available_blocks(self) -> int:
        """Every rank sizes its own cache; all must hold the same block ids, so the smallest wins."""
        return min(self.collective_rpc("determine_num_available_blocks"))

    def initialize_cache(self, num_gpu_blocks: int) -> None:
        self.collective_rpc("initialize_cache", (num_gpu_blocks,))

    def execute_model(self, scheduler_output, non_block: bool = False):
        return self.collective_rpc("execute_model", (scheduler_output,), non_block, self.output_rank)

    def sample_tokens(self, grammar_output):
        return self.collective_rpc("sample_tokens", (grammar_output,), unique_reply_rank=self.output_rank)

    def take_draft_token_ids(self) -> tuple[list[str], list[list[int]]] | None:
        """Every rank proposed the same drafts from the same tokens (and clears them); rank 0's come back."""
        return self.collective_rpc("take_draft_token_ids", unique_reply_rank=self.output_rank)

    def profile(self, is_start: bool, path: str) -> str | None:
        """Every rank profiles; rank r > 0 writes PATH.rankR.json; rank 0's path comes back."""
        return self.collective_rpc("profile", (is_start, path))[0]

    def shutdown(self) -> None:
        self.shutting_down = True
        self._finalizer()


def exit_description(proc) -> str:
    """'exited with code 1' or 'was killed by signal SIGKILL (exit code -9)'.

    The sentinel (or a pipe's EOF) can fire before the process is reaped, when exitcode is still None: join it.
    """
    proc.join(5.0)
    code = proc.exitcode
    if code is None:
        return "stopped answering (still running)"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"was killed by signal {-code} (exit code {code})"
    return f"exited with code {code}"


def _check_devices(vllm_config: VllmConfig) -> None:
    """NCCL needs one GPU per rank on this host: say so before spawning anything."""
    import torch
    if vllm_config.device.startswith("cuda") or (vllm_config.device == "auto" and torch.cuda.is_available()):
        n = torch.cuda.device_count()
        if n < vllm_config.parallel_config.world_size:
            raise ValueError(f"tensor_parallel_size={vllm_config.parallel_config.world_size} needs as many GPUs "
                             f"on this host; torch sees {n} (use device='cpu' for gloo ranks)")


def _make_worker_process(ctx, vllm_config: VllmConfig, rank: int, init_method: str,
                         earlier: list[WorkerProcHandle]) -> WorkerProcHandle:
    rpc_reader, rpc_writer = ctx.Pipe(duplex=False)
    response_reader, response_writer = ctx.Pipe(duplex=False)
    death_reader, death_writer = ctx.Pipe(duplex=False)
    # A forked child inherits every open fd: it must close the parent's ends (its own and earlier workers').
    inherited = [rpc_writer, response_reader, death_writer] + [
        end for w in earlier for end in (w.rpc_writer, w.response_reader, w.death_writer)
    ] if ctx.get_start_method() == "fork" else []
    proc = ctx.Process(target=WorkerProc.worker_main, name=f"TPWorker_{rank}", daemon=True,
                       args=(vllm_config, rank, rank, init_method, rpc_reader, response_writer, death_reader,
                             inherited))
    proc.start()
    for end in (rpc_reader, response_writer, death_reader):  # the child has its copies
        end.close()
    return WorkerProcHandle(rank, proc, rpc_writer, response_reader, death_writer)


def _terminate_workers(workers: list[WorkerProcHandle]) -> None:
    """Close the pipes (a worker exits on EOF), then SIGTERM and SIGKILL whatever is still alive."""
    for w in workers:
        for end in (w.rpc_writer, w.death_writer):
            end.close()
    deadline = time.monotonic() + 2.0
    for w in workers:
        w.proc.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.proc.is_alive():
            w.proc.terminate()
            w.proc.join(2.0)
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(2.0)
        w.response_reader.close()


class WorkerProc:
    """The worker side: one Worker for one rank, looping over the RPC pipe (vLLM: WorkerProc)."""

    @staticmethod
    def worker_main(vllm_config: VllmConfig, local_rank: int, rank: int, init_method: str, rpc_reader,
                    response_writer, death_reader, inherited=()) -> None:
        for end in inherited:
            end.close()

        def signal_handler(signum, frame):
            raise SystemExit(0)
        signal.signal(signal.SIGTERM, signal_handler)
        signal.signal(signal.SIGINT, signal_handler)
        threading.Thread(target=_watch_death_pipe, args=(death_reader,), daemon=True, name="DeathPipeMonitor").start()
        _set_worker_threads(vllm_config)
        try:
            from minivllm.worker.gpu_worker import Worker
            worker = Worker(vllm_config, None, local_rank, rank, init_method)
            worker.load_model()
        except BaseException:
            response_writer.send((FAILURE, traceback.format_exc()))
            raise
        response_writer.send((READY, os.getpid()))
        WorkerProc.worker_busy_loop(worker, rank, rpc_reader, response_writer)

    @staticmethod
    def worker_busy_loop(worker, rank: int, rpc_reader, response_writer) -> None:
        """Run what the executor broadcasts; answer if we are the reply rank; report a failure and exit."""
        while True:
            try:
                method, args, output_rank = pickle.loads(rpc_reader.recv_bytes())
            except EOFError:
                return  # the executor closed the pipe: shut down
            try:
                output = getattr(worker, method)(*args)
            except BaseException:
                response_writer.send((FAILURE, traceback.format_exc()))
                sys.exit(1)
            if output_rank is None or output_rank == rank:
                response_writer.send((SUCCESS, output))


def _watch_death_pipe(death_reader) -> None:
    """The parent holds the write end; EOF means it is gone (even by SIGKILL): exit, do not linger."""
    try:
        death_reader.recv()
    except (EOFError, OSError):
        pass
    os._exit(1)


def _set_worker_threads(vllm_config: VllmConfig) -> None:
    """On CPU the ranks share the cores: each takes its share of torch threads unless OMP_NUM_THREADS is set."""
    import torch
    if "OMP_NUM_THREADS" not in os.environ and not (vllm_config.device != "cpu" and torch.cuda.is_available()):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // vllm_config.parallel_config.world_size))
