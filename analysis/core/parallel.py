"""Data parallelism on Hugging Face accelerate: one code path for one process and for N processes started by
``accelerate launch`` (or ``torchrun``), one model copy per process.

The work is a *plan*: a list of batches made once, by the main process, and sent to every process. At step
``s`` process ``r`` takes batch ``s * N + r`` (none once the plan runs out, so every process takes the same
number of steps and no collective call waits for a process that has finished). After each step the main
process gathers what every process produced, in rank order, which is plan order: the merged results are those
of one process going through the plan, row for row, and only one batch per process is held at a time.

With one process (no ``WORLD_SIZE`` above 1 in the environment) nothing here imports accelerate or
``torch.distributed``: ``broadcast`` returns its argument and ``gather`` a one-element list.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
from collections.abc import Iterator, Sequence
from functools import cache
from typing import TypeVar

T = TypeVar("T")


def world_size() -> int:
    """How many processes the launcher started (1 outside ``accelerate launch`` / ``torchrun``)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0") or 0) == 0


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place among the processes of one run."""

    index: int = 0
    count: int = 1
    device: str | None = None  # this process's device under a launcher (``cuda:<local rank>`` or ``cpu``)

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def device_for(self, asked: str) -> str:
        """The device this process uses when ``asked`` was requested: under a launcher, ``auto`` and ``cuda``
        mean this process's own GPU (one model copy per process)."""
        if self.count == 1 or asked == "cpu" or self.device is None:
            return asked
        return self.device

    def steps(self, plan: Sequence[T]) -> Iterator[T | None]:
        """This process's item of each step of ``plan`` (None once the plan runs out); the same number of
        steps in every process."""
        for start in range(0, len(plan), self.count):
            i = start + self.index
            yield plan[i] if i < len(plan) else None

    def broadcast(self, obj: T) -> T:
        """The main process's ``obj`` in every process."""
        if self.count == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: T) -> list[T] | None:
        """Every process's ``obj`` in rank order, in the main process; None in the others."""
        if self.count == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.count if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_gather(self, obj: T) -> list[T]:
        """Every process's ``obj`` in rank order, in every process."""
        if self.count == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.count
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.count > 1:
            import torch.distributed as dist

            dist.barrier()


ONE = Ranks()  # a run in one process


@cache
def ranks(cpu: bool = False) -> Ranks:
    """This process's :class:`Ranks`; under a launcher, joins the process group through accelerate's
    ``PartialState`` (gloo on CPU, NCCL on GPUs; ``cpu`` forces gloo)."""
    if world_size() == 1:
        return ONE
    import torch
    from accelerate import PartialState

    state = PartialState(cpu=cpu or not torch.cuda.is_available())
    atexit.register(leave_process_group)
    device = "cpu" if state.device.type == "cpu" else str(state.device)
    share_cores(int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes)))
    return Ranks(state.process_index, state.num_processes, device)


EXIT_WAIT_SECONDS = 30  # how long a process waits at exit for the others of its group


def leave_process_group() -> None:
    """Destroy the process group as the process exits. Left to the interpreter's shutdown, gloo's threads were
    destroyed while still joinable: once in a CI run a helper process aborted with "terminate called without an
    active exception" (exit -6) after its work was done."""
    import datetime

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            if dist.get_backend() == "gloo":  # every process done with its sockets before any tears them down (it
                # happened once more, with the destroy alone); bounded, so that a process that failed early waits
                # at most this long for the others
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=EXIT_WAIT_SECONDS))
        except (RuntimeError, ValueError):  # another process left already, or failed: leave without waiting
            pass
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError) as exc:  # exiting anyway: say it, do not fail the run
            print(f"note: leaving the process group: {exc}", file=sys.stderr)


def share_cores(processes: int) -> int:
    """Give this process its share of the machine's cores for torch's and numba's threads, so that N processes
    on one machine do not each start a thread per core (measured: two processes on two cores ran 0.57x the
    speed of one until numba's threads were capped). Returns the threads per process."""
    import torch

    threads = max(1, (os.cpu_count() or 1) // max(1, processes))
    torch.set_num_threads(threads)
    try:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        pass
    return threads


def ranks_for(device: str) -> Ranks:
    """:func:`ranks` for a run asked to use ``device``."""
    return ranks(cpu=device == "cpu")


def launch_command(processes: int, *args: str) -> list[str]:
    """The command that runs ``python <args>`` in ``processes`` processes on this machine through accelerate.
    ``--multi_gpu`` is accelerate's name for its torchrun launcher: without it (or a config file saying so),
    ``accelerate launch --num_processes N`` on a machine with no GPU starts one process, not N."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", *args]
