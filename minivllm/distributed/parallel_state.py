"""The tensor-parallel process group (vLLM: distributed/parallel_state.py).

vLLM builds a world group and then a GroupCoordinator per kind of parallelism; minivllm has tensor
parallelism only, so the world *is* the TP group. Unlike vLLM, a process that never initialized a group
sees a group of one whose collectives are the identity: with tensor_parallel_size=1 the engine starts no
process and no group, and the parallel layers run exactly the single-device arithmetic.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist


class GroupCoordinator:
    """One process group: this rank's place in it and the collectives over it."""

    def __init__(self, world_size: int, rank_in_group: int, device_group=None) -> None:
        self.world_size = world_size
        self.rank_in_group = rank_in_group
        self.device_group = device_group

    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        dist.all_reduce(input_, group=self.device_group)  # in place, as vLLM's out-of-place op is not needed here
        return input_

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        dim = dim % input_.dim()
        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.device_group)


_SINGLE = GroupCoordinator(1, 0)
_TP: GroupCoordinator | None = None


def get_tp_group() -> GroupCoordinator:
    """The TP group, or a group of one when this process never joined one."""
    return _TP or _SINGLE


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def init_distributed_environment(world_size: int, rank: int, distributed_init_method: str,
                                 backend: str, timeout_s: float | None = None) -> None:
    """Join the default process group: rank 0 hosts the TCP store at distributed_init_method.

    Every socket is bound to the rendezvous address (loopback by default), never to all interfaces: rank 0
    hands the store a socket it bound itself (torch's TCPStore alone listens on [::]), and gloo / NCCL
    are pointed at the interface that holds the address (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, unless
    set). vLLM leaves this to torch and the environment.
    """
    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RuntimeError(f"torch.distributed already initialized with world size {dist.get_world_size()}")
        return
    timeout = timedelta(seconds=timeout_s) if timeout_s else dist.default_pg_timeout
    if not distributed_init_method.startswith("tcp://"):
        dist.init_process_group(backend, init_method=distributed_init_method, world_size=world_size, rank=rank,
                                timeout=timeout)
        return
    host, _, port = distributed_init_method[len("tcp://"):].rpartition(":")
    host, port = host.strip("[]"), int(port)
    interface = interface_of_address(host)
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    listen_fd = None
    if rank == 0:
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
        listen_fd = listener.detach()  # the store owns the descriptor from here on
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout, master_listen_fd=listen_fd)
    dist.init_process_group(backend, store=store, world_size=world_size, rank=rank, timeout=timeout)


def interface_of_address(ip: str) -> str | None:
    """The network interface that holds ip ('lo' for 127.0.0.1 / ::1), or None if none here does."""
    try:
        packed = socket.inet_pton(socket.AF_INET6 if ":" in ip else socket.AF_INET, ip)
    except OSError:
        return None  # a host name: leave the choice to gloo / NCCL
    if ":" in ip:
        try:
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    fields = line.split()
                    if bytes.fromhex(fields[0]) == packed:
                        return fields[-1]
        except OSError:
            return None
        return None
    import fcntl
    import struct
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                ifreq = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
        if ifreq[20:24] == packed:
            return name
    return None


def initialize_model_parallel(tensor_model_parallel_size: int) -> None:
    """Make the TP group (here: the whole world) the one get_tp_group returns."""
    global _TP
    world = dist.get_world_size()
    if world != tensor_model_parallel_size:
        raise RuntimeError(f"world size {world} != tensor_model_parallel_size {tensor_model_parallel_size} "
                           "(minivllm has no pipeline or data parallelism)")
    _TP = GroupCoordinator(world, dist.get_rank(), dist.group.WORLD)


def destroy_model_parallel() -> None:
    global _TP
    _TP = None
    if dist.is_initialized():
        dist.destroy_process_group()


def get_distributed_init_method(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def get_open_port(host: str = "127.0.0.1") -> int:
    """A port free right now (the OS picks it); a race with another process is possible, as in vLLM."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Fail before spawning anything when the rendezvous port is taken (the store would fail obscurely)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the TCP store does: TIME_WAIT is fine
        try:
            s.bind((host, port))
        except OSError as e:
            raise RuntimeError(f"tensor-parallel rendezvous port {host}:{port} is not free ({e.strerror}); "
                               "pick another master_port, or 0 for any free port") from e
