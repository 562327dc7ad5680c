"""Training on several processes with torch.distributed: one code path for CPU (gloo) and GPU (NCCL).

Start K processes per machine with torchrun (``torchrun --nproc_per_node=K -m legion train ...``,
or ``legion train --nproc K ...``). Each process (a rank) simulates its own envs on its own device
(``cuda:<local rank>``, or the CPU) with seed + global rank, and runs the same PPO update on its own
rollout; rsl-rl's PPO does the rest once it is given the process group (``multi_gpu_cfg``): it
averages gradients across ranks in buckets, averages the KL of the adaptive learning rate and
broadcasts rank 0's learning rate, and its normalizers combine every rank's statistics. Only rank 0
logs, prints and writes checkpoints. rsl-rl's own runner would refuse anything but NCCL on
``cuda:LOCAL_RANK``; its PPO and normalizer are backend-agnostic, so they are used as they are.

A rank that dies makes the others fail at their next collective operation (the process group
notices the closed connection, or its ``timeout_s`` passes) and exit with :class:`RankLost`
instead of hanging.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from legion.agents.runner import TrainingDiverged


class RankLost(TrainingDiverged):
    """Another rank stopped answering: it died, was killed, or its machine is unreachable."""


@dataclass(frozen=True)
class Group:
    """This process's place in the process group."""

    rank: int  # global rank, 0 .. world_size - 1
    local_rank: int  # rank on this machine
    world_size: int
    backend: str  # "gloo" (CPU) or "nccl" (CUDA)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def ppo_cfg(self) -> dict:
        """rsl-rl PPO's ``multi_gpu_cfg`` (the name is rsl-rl's; it works with any backend)."""
        return {"global_rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size}


def launched() -> bool:
    """Whether this process was started by torchrun as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def join(device: str, timeout_s: float = 600.0) -> tuple[Group, str]:
    """Joins the process group torchrun set up (its environment variables) and returns the group and
    this rank's device: ``cuda:<local rank>`` for a CUDA run (one GPU per rank), else the CPU."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ["WORLD_SIZE"])
    cuda = device.startswith("cuda")
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"rank {rank} has local rank {local_rank} but this machine has "
                             f"{torch.cuda.device_count()} CUDA devices: start at most that many processes per node.")
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return Group(rank, local_rank, world_size, backend), device


T = TypeVar("T")


def broadcast(obj: T, group: Group) -> T:
    """Rank 0's ``obj`` on every rank (pickled; e.g. a checkpoint, so only rank 0 reads files)."""
    box = [obj]  # the other ranks' is replaced by rank 0's
    dist.broadcast_object_list(box, src=0)
    return box[0]


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def is_lost_rank(error: BaseException) -> bool:
    """Whether an error is a collective operation failing because a peer is gone."""
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(s in text for s in (
        "Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out", "timed out",
        "NCCL communicator was aborted", "ProcessGroup"))
