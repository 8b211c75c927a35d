"""The Ray executor: each job is one Ray task with its own CPU/GPU request, retried a bounded number
of times when its worker dies; outcomes come back to the driver as they finish (ray.wait), so the
driver stays the only writer of the store and an interrupted sweep resumes like a local one.

Ray is optional (the `ray` extra); without it this module's executor says so in one line, with the
pip command that fits the installation (install.py).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import UnavailableError, ZooError
from ..install import install_hint
from .base import MAX_RETRIES, ExecutorBase, Job, Outcome, plugin_targets, retries_text, run_job

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
# A custom Ray resource, 1 per node: a timed CPU case reserves it, so no two such cases (whose
# timings would share the node's cores) run on one node at once. Nodes of a cluster start with it.
TIMING_SLOT = "zoo_timing_slot"
NODE_RESOURCES = json.dumps({TIMING_SLOT: 1})


class RayError(ZooError):
    """A Ray cluster that cannot be reached or cannot place a job."""


def import_ray() -> Any:
    """The ray module, or UnavailableError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise UnavailableError(
            "--executor ray needs Ray, which is not installed; install it with "
            + install_hint("ray")
        ) from None
    return ray


def check_address(address: str) -> str:
    """'auto', 'ray://HOST:PORT' or 'HOST:PORT'; RayError saying what works otherwise."""
    if address == "auto":
        return address
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit() or "/" in hostport:
        raise RayError(
            f"--ray-address {address!r} is not an address; use 'auto' (the cluster this machine "
            "joined with 'ray start'), 'ray://HOST:PORT' (Ray client) or 'HOST:PORT' (head node)"
        )
    return address


def probe(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast (seconds, not Ray's minute of retries) when nothing listens at HOST:PORT."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as err:
        raise RayError(
            f"no Ray cluster answers at {address} ({err.strerror or err}); start one with "
            "'ray start --head' there, or leave out --ray-address to run on a local Ray runtime"
        ) from None


class RayExecutor(ExecutorBase):
    """Jobs as Ray tasks: on the cluster at `address` (else $RAY_ADDRESS), or on a Ray runtime
    started here with this machine's CPUs and GPUs."""

    name = "ray"

    def __init__(
        self,
        *,
        address: str | None = None,
        cpus_per_case: float | None = None,
        gpus_per_case: float | None = None,
        max_retries: int = MAX_RETRIES,
    ) -> None:
        address = address or os.environ.get("RAY_ADDRESS")  # Ray's own way to name a cluster
        self.address = check_address(address) if address else None
        self.cpus_per_case, self.gpus_per_case = cpus_per_case, gpus_per_case
        self.max_retries = max_retries
        self._ray: Any = None
        self._owned = False  # True when prepare() started or connected the runtime

    # ---- resources ----------------------------------------------------------------------------

    def resources(self, job: Job) -> tuple[float, float]:
        """(CPUs, GPUs) one job asks for: the flags, else the job's threads (or 1) and one GPU
        for a CUDA job."""
        cpus = self.cpus_per_case or job.threads or 1
        if self.gpus_per_case is not None:
            gpus = self.gpus_per_case
        else:
            gpus = 1 if job.device.startswith("cuda") else 0
        return float(cpus), float(gpus)

    def slots(self, job: Job) -> dict[str, float]:
        """The custom resources a job reserves: a timed CPU case takes its node's one timing
        slot (training runs, untimed, share nodes by their CPU requests alone)."""
        return {TIMING_SLOT: 1.0} if job.timed and not job.device.startswith("cuda") else {}

    # ---- lifecycle ----------------------------------------------------------------------------

    def prepare(self, jobs: Sequence[Job]) -> None:
        ray = self._connect()
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        if any(self.slots(j) for j in jobs) and not any(n.get(TIMING_SLOT) for n in nodes):
            raise RayError(
                f"no node of the Ray cluster has the {TIMING_SLOT} resource that a CPU case "
                "reserves (one CPU case per node at a time, so timings do not share cores); "
                f"start each node with 'ray start ... --resources '{NODE_RESOURCES}''"
            )
        for cpus, gpus in sorted({self.resources(j) for j in jobs}):
            if not any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes):
                have = ", ".join(f"{n.get('CPU', 0):g} CPU/{n.get('GPU', 0):g} GPU" for n in nodes)
                raise RayError(
                    f"no node of the Ray cluster has {cpus:g} CPU and {gpus:g} GPU for one case "
                    f"(nodes: {have or 'none'}); lower --cpus-per-case/--gpus-per-case "
                    "or add a node that has them"
                )

    def _connect(self) -> Any:
        if self._ray is not None:
            return self._ray
        ray = import_ray()
        if not ray.is_initialized():
            if self.address:
                probe(self.address)
            kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
            if not self.address:
                kwargs.update(
                    num_cpus=os.cpu_count(),
                    include_dashboard=False,
                    resources={TIMING_SLOT: 1},
                )
            try:
                ray.init(address=self.address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as err:
                raise RayError(
                    f"cannot connect to a Ray cluster at {self.address or 'a local runtime'}: "
                    f"{_first_line(err)}; start one with 'ray start --head', or leave out "
                    "--ray-address to run on a local Ray runtime"
                ) from None
            self._owned = True
        self._ray = ray
        return ray

    def close(self) -> None:
        """Shut down the runtime prepare() started or connected (one it found running stays)."""
        if self._ray is not None and self._owned:
            self._ray.shutdown()
        self._ray, self._owned = None, False

    def describe(self) -> str:
        ray = self._connect()
        total = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        where = self.address or "a local runtime"
        return (
            f"ray at {where}: {nodes} node(s), {total.get('CPU', 0):g} CPUs, "
            f"{total.get('GPU', 0):g} GPUs"
        )

    # ---- running ------------------------------------------------------------------------------

    def run(
        self, jobs: Sequence[Job], *, on_start: Callable[[Job], None] | None = None
    ) -> Iterator[Outcome]:
        """Submit every job, yield outcomes as they finish; pending jobs are cancelled when the
        caller stops early (Ctrl-C, an error while storing)."""
        ray = self._connect()
        task = ray.remote(run_job)
        plugins = plugin_targets()  # a backend a plugin registers is known on every worker
        by_ref: dict[Any, Job] = {}
        for job in jobs:
            cpus, gpus = self.resources(job)
            ref = task.options(
                num_cpus=cpus,
                num_gpus=gpus,
                resources=self.slots(job),
                max_retries=self.max_retries,
                retry_exceptions=False,
                name=job.label,
            ).remote(
                job.fn,
                job.args,
                job.kwargs,
                key=job.key,
                device=job.device,
                threads=job.threads,
                plugins=plugins,
            )
            by_ref[ref] = job
        pending = list(by_ref)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield self._outcome(ray, ref, by_ref[ref])
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def _outcome(self, ray: Any, ref: Any, job: Job) -> Outcome:
        errors = ray.exceptions
        try:
            return ray.get(ref)
        except errors.OutOfMemoryError as err:
            return Outcome(
                key=job.key,
                error=f"killed by Ray's memory monitor: {_first_line(err)}",
                oom=True,
            )
        except errors.RayTaskError as err:  # raised inside the task (e.g. it could not unpickle)
            return Outcome(key=job.key, error=f"failed on its Ray worker: {_first_line(err)}")
        except errors.RayError as err:  # the worker or its node died, every retry too
            return Outcome(
                key=job.key,
                error=(
                    f"its Ray worker died ({type(err).__name__}), "
                    f"{retries_text(self.max_retries)} too: {_first_line(err)}"
                ),
            )


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return (lines[0] if lines else type(err).__name__)[:300]
