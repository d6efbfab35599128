"""EngineCoreClient (vLLM: v1/engine/core_client.py): how a frontend talks to its EngineCore.

    InprocClient    the core lives in this process; get_output() runs one step (notebooks, traces, tests)
    SyncMPClient    the core runs in a spawned process; ZMQ + msgpack; an IO thread reads outputs (LLM)
    AsyncMPClient   the same process split, for asyncio; an output task feeds an asyncio.Queue (AsyncLLM)

The client owns no scheduler state: it only sends EngineCoreRequests / aborts / utility calls and
receives EngineCoreOutputs. A dead core turns every wait into EngineDeadError.
"""
from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import multiprocessing.connection
import os
import queue
import shutil
import tempfile
import threading
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field

import msgspec
import zmq
import zmq.asyncio

from minivllm import envs
from minivllm.config import VllmConfig
from minivllm.engine import EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType
from minivllm.engine.core import (
    ENGINE_CORE_DEAD,
    ENGINE_IDENTITY,
    HANDSHAKE_FAILED,
    HANDSHAKE_READY,
    EngineCore,
    EngineCoreProc,
)
from minivllm.engine.exceptions import EngineDeadError
from minivllm.metrics.stats import SchedulerStats

STARTUP_TIMEOUT_S = envs.MINIVLLM_ENGINE_READY_TIMEOUT_S


class EngineCoreClient:
    """The interface every client offers; make_client picks one."""

    @staticmethod
    def make_client(multiprocess_mode: bool, asyncio_mode: bool, vllm_config: VllmConfig,
                    executor_class=None, log_stats: bool = True) -> EngineCoreClient:
        if asyncio_mode:
            if not multiprocess_mode:
                raise ValueError("asyncio mode needs the multiprocess EngineCore")
            return AsyncMPClient(vllm_config, executor_class, log_stats)
        if multiprocess_mode:
            return SyncMPClient(vllm_config, executor_class, log_stats)
        return InprocClient(vllm_config, executor_class, log_stats)

    def get_stats(self) -> SchedulerStats:
        return msgspec.convert(self.call_utility("get_stats"), SchedulerStats)

    def reset_prefix_cache(self) -> bool:
        return bool(self.call_utility("reset_prefix_cache"))

    def profile(self, is_start: bool = True, path: str = "minivllm_core_profile.json"):
        return self.call_utility("profile", is_start, path)

    def call_utility(self, method: str, *args):
        raise NotImplementedError


class InprocClient(EngineCoreClient):
    """No process, no sockets: the EngineCore's own methods. Attributes pass through (client.scheduler)."""

    def __init__(self, vllm_config: VllmConfig, executor_class=None, log_stats: bool = True) -> None:
        self.engine_core = EngineCore(vllm_config, executor_class, log_stats)

    def __getattr__(self, name: str):
        if name == "engine_core":
            raise AttributeError(name)
        return getattr(self.engine_core, name)

    def get_output(self) -> EngineCoreOutputs:
        outputs, model_executed = self.engine_core.step_fn()
        self.engine_core.post_step(model_executed)
        return outputs

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def call_utility(self, method: str, *args):
        return getattr(self.engine_core, method)(*args)

    def get_stats(self) -> SchedulerStats:
        return self.engine_core.get_stats()

    def shutdown(self) -> None:
        self.engine_core.shutdown()


@dataclass
class BackgroundResources:
    """Everything the client's threads and finalizer touch, with no reference back to the client.

    So the client can be garbage collected (and its process stopped) while its IO threads still run.
    """

    ctx: zmq.Context
    tmpdir: str
    output_address: str
    input_socket: zmq.Socket | None = None
    output_socket: zmq.Socket | None = None
    proc: multiprocessing.process.BaseProcess | None = None
    engine_dead: bool = False
    shutdown_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __call__(self) -> None:
        """Shut down: stop the process (SIGTERM, then SIGKILL), stop the threads, close sockets, remove files."""
        self.shutdown_event.set()
        proc = self.proc
        if proc is not None and proc.is_alive():
            proc.terminate()
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(1.0)
        for s in (self.input_socket, self.output_socket):
            if s is not None and not s.closed:
                s.close(linger=0)
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


class MPClient(EngineCoreClient):
    """Spawn EngineCoreProc, bind ROUTER (input) and PULL (output) on ipc://, wait for its READY handshake."""

    def __init__(self, asyncio_mode: bool, vllm_config: VllmConfig, executor_class=None,
                 log_stats: bool = True) -> None:
        self.vllm_config = vllm_config
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        tmpdir = tempfile.mkdtemp(prefix="minivllm-")
        input_address, output_address = f"ipc://{tmpdir}/input", f"ipc://{tmpdir}/output"
        self.resources = res = BackgroundResources(zmq.Context(), tmpdir, output_address)
        self._finalizer = weakref.finalize(self, res)
        res.input_socket = res.ctx.socket(zmq.ROUTER)
        res.input_socket.setsockopt(zmq.SNDHWM, 0)  # unbounded: a burst of requests must never block or drop
        res.input_socket.setsockopt(zmq.RCVHWM, 0)
        res.input_socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a vanished core raises, not drops
        res.input_socket.bind(input_address)
        res.output_socket = res.ctx.socket(zmq.PULL)
        res.output_socket.setsockopt(zmq.RCVHWM, 0)
        res.output_socket.bind(output_address)
        spawn = multiprocessing.get_context("spawn")
        # A daemonic process may not start children, and with TP the core starts the workers (vLLM's core
        # process is never daemonic; at tp=1 ours stays daemonic as before).
        res.proc = spawn.Process(target=EngineCoreProc.run_engine_core, name="EngineCore_0",
                                 daemon=vllm_config.parallel_config.world_size == 1,
                                 args=(vllm_config, input_address, output_address, os.getpid(), executor_class,
                                       log_stats))
        res.proc.start()
        try:
            self._wait_for_engine_startup(STARTUP_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        monitor = threading.Thread(target=_monitor_engine_core, args=(res,), daemon=True, name="EngineCoreMonitor")
        monitor.start()
        res.threads.append(monitor)
        self._call_ids = itertools.count()

    def _wait_for_engine_startup(self, timeout_s: float) -> None:
        """The handshake: READY (with the KV block count) or FAILED (with a traceback), or the process died."""
        res = self.resources
        poller = zmq.Poller()
        poller.register(res.input_socket, zmq.POLLIN)
        waited = 0.0
        while waited < timeout_s:
            if poller.poll(100):
                identity, status, payload = res.input_socket.recv_multipart()
                assert identity == ENGINE_IDENTITY, identity
                if status == HANDSHAKE_FAILED:
                    raise RuntimeError("EngineCore failed to start:\n" + payload.decode(errors="replace"))
                assert status == HANDSHAKE_READY, status
                info = msgspec.msgpack.decode(payload)
                self.vllm_config.cache_config.num_gpu_blocks = info["num_gpu_blocks"]
                self.engine_pid = info["pid"]
                return
            waited += 0.1
            if not res.proc.is_alive():
                raise RuntimeError(
                    f"EngineCore process exited with code {res.proc.exitcode} during start-up (before its READY "
                    "handshake); its traceback is above. A script that starts the engine at import time needs "
                    "`if __name__ == '__main__':` (the core is a spawned process), or pass multiprocess=False.")
        raise TimeoutError(f"EngineCore did not send READY within {timeout_s:.0f} s "
                           "(set MINIVLLM_ENGINE_READY_TIMEOUT_S to wait longer)")

    @property
    def engine_dead(self) -> bool:
        return self.resources.engine_dead

    def _send(self, request_type: EngineCoreRequestType, obj) -> None:
        if self.resources.engine_dead:
            raise EngineDeadError()
        try:
            self.resources.input_socket.send_multipart([ENGINE_IDENTITY, request_type.value, self.encoder.encode(obj)],
                                                       copy=False)
        except zmq.ZMQError as e:
            self.resources.engine_dead = True
            raise EngineDeadError(f"EngineCore unreachable ({e})") from e

    def shutdown(self) -> None:
        self._finalizer()


def _monitor_engine_core(res: BackgroundResources) -> None:
    """Wait for the core process to end; if nobody asked it to, mark it dead and wake the output reader."""
    multiprocessing.connection.wait([res.proc.sentinel])
    if res.shutdown_event.is_set():
        return
    res.engine_dead = True
    try:
        s = res.ctx.socket(zmq.PUSH)
        s.connect(res.output_address)
        s.send(ENGINE_CORE_DEAD)
        s.close(linger=1000)
    except zmq.ZMQError:
        pass  # the context is being torn down: nobody is waiting


class SyncMPClient(MPClient):
    """Blocking client for LLM/LLMEngine: an IO thread decodes outputs into a queue.Queue."""

    def __init__(self, vllm_config: VllmConfig, executor_class=None, log_stats: bool = True) -> None:
        super().__init__(False, vllm_config, executor_class, log_stats)
        self.outputs_queue: queue.Queue[EngineCoreOutputs | Exception] = queue.Queue()
        self.utility_results: dict[int, Future] = {}
        t = threading.Thread(target=_process_outputs_socket, daemon=True, name="EngineCoreOutputReader",
                             args=(self.resources, self.decoder, self.outputs_queue, self.utility_results))
        t.start()
        self.resources.threads.append(t)

    def get_output(self) -> EngineCoreOutputs:
        out = self.outputs_queue.get()
        if isinstance(out, Exception):
            self.outputs_queue.put_nowait(out)  # every later caller sees it too
            raise out
        return out

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(EngineCoreRequestType.ADD, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and not self.resources.engine_dead:
            self._send(EngineCoreRequestType.ABORT, list(request_ids))

    def call_utility(self, method: str, *args):
        call_id = next(self._call_ids)
        future: Future = Future()
        self.utility_results[call_id] = future
        self._send(EngineCoreRequestType.UTILITY, (call_id, method, args))
        return future.result()


def _process_outputs_socket(res: BackgroundResources, decoder, outputs_queue: queue.Queue,
                            utility_results: dict[int, Future]) -> None:
    socket = res.output_socket
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    while not res.shutdown_event.is_set():
        if not poller.poll(100):
            continue
        frame = socket.recv(copy=False)
        if not _handle_output_frame(res, frame, decoder, outputs_queue, utility_results):
            return


def _handle_output_frame(res: BackgroundResources, frame: zmq.Frame, decoder, outputs_queue,
                         utility_results: dict) -> bool:
    """Route one frame from the core (shared by the sync and asyncio readers); False once the core is dead."""
    if _is_dead_marker(frame):
        res.engine_dead = True
        error = EngineDeadError()
        for f in utility_results.values():
            if not f.done():
                f.set_exception(error)
        utility_results.clear()
        outputs_queue.put_nowait(error)
        return False
    outputs = decoder.decode(frame.buffer)
    if outputs.utility_output is not None:
        _resolve_utility(outputs.utility_output, utility_results)
    if outputs.outputs or outputs.scheduler_stats is not None:
        outputs_queue.put_nowait(outputs)
    return True


def _is_dead_marker(frame: zmq.Frame) -> bool:
    return frame.buffer.nbytes == len(ENGINE_CORE_DEAD) and bytes(frame.buffer) == ENGINE_CORE_DEAD


def _resolve_utility(out, utility_results: dict) -> None:
    future = utility_results.pop(out.call_id, None)
    if future is None or future.done():
        return
    if out.failure_message is not None:
        future.set_exception(RuntimeError(f"utility call failed in EngineCore: {out.failure_message}"))
    else:
        future.set_result(out.result)


class AsyncMPClient(MPClient):
    """asyncio client for AsyncLLM: an output task decodes frames into an asyncio.Queue.

    Sends go through the ROUTER directly from the event loop: ipc sends never block (no HWM).
    """

    def __init__(self, vllm_config: VllmConfig, executor_class=None, log_stats: bool = True) -> None:
        self.queue_task: asyncio.Task | None = None  # before the handshake: a failed start calls shutdown()
        super().__init__(True, vllm_config, executor_class, log_stats)
        self.outputs_queue: asyncio.Queue | None = None
        self.utility_results: dict[int, asyncio.Future] = {}

    def _ensure_output_queue_task(self) -> asyncio.Queue:
        if self.outputs_queue is None:
            self.outputs_queue = asyncio.Queue()
            self.queue_task = asyncio.get_running_loop().create_task(
                _process_outputs_socket_async(self.resources, self.decoder, self.outputs_queue,
                                              self.utility_results), name="EngineCoreOutputQueueTask")
        return self.outputs_queue

    async def get_output_async(self) -> EngineCoreOutputs:
        q = self._ensure_output_queue_task()
        out = await q.get()
        if isinstance(out, Exception):
            q.put_nowait(out)
            raise out
        return out

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self._ensure_output_queue_task()
        self._send(EngineCoreRequestType.ADD, request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self.abort_requests(request_ids)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Synchronous on purpose: callable from a cancelled task's cleanup without awaiting."""
        if request_ids and not self.resources.engine_dead:
            self._send(EngineCoreRequestType.ABORT, list(request_ids))

    async def call_utility_async(self, method: str, *args):
        self._ensure_output_queue_task()
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self.utility_results[call_id] = future
        self._send(EngineCoreRequestType.UTILITY, (call_id, method, args))
        return await future

    async def get_stats_async(self) -> SchedulerStats:
        return msgspec.convert(await self.call_utility_async("get_stats"), SchedulerStats)

    async def reset_prefix_cache_async(self, reset_running_requests: bool = False,
                                       reset_connector: bool = False) -> bool:
        return bool(await self.call_utility_async("reset_prefix_cache", reset_running_requests, reset_connector))

    def shutdown(self) -> None:
        if self.queue_task is not None and not self.queue_task.done():
            self.queue_task.cancel()
        super().shutdown()


async def _process_outputs_socket_async(res: BackgroundResources, decoder, outputs_queue: asyncio.Queue,
                                        utility_results: dict) -> None:
    socket = zmq.asyncio.Socket.from_socket(res.output_socket)
    while True:
        frame = await socket.recv(copy=False)
        if not _handle_output_frame(res, frame, decoder, outputs_queue, utility_results):
            return
