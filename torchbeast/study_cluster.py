"""A study's cells on an existing Ray cluster (``python -m torchbeast.study FILE
--ray_address HOST:PORT``).

Each cell is one Ray actor that asks for the cell's ``[resources]`` (CPUs, GPUs), so Ray
starts it on a node that has them free and queues it until one has; the actor runs the
cell's commands on that node exactly as a study on one machine does (train from the
checkpoint if there is one, then evaluate). Why an actor per cell, not Ray Tune: a cell is
a whole command line that checkpoints and resumes itself, so all a study needs from Ray
is placement by resources and a way to ask a cell to stop (an actor's second method);
Tune would wrap each run in its own trial, reporting and storage layers for nothing. Why
not placement groups: a cell's processes all run on one node, which a plain resource
request already guarantees.

Where the files go (``--files``):

- ``shared``: every node sees the study's folder at the same path (NFS, a cluster file
  system); cells read and write it in place, and a cell resumes on any node.
- ``copy``: the cell's folder travels with it to its node (its checkpoint too, so it
  resumes there) and comes back when it ends or is stopped; it runs in a temporary
  folder on the node, removed afterwards. LASER's saved replay (``replay.tar``) stays
  behind: a cell resumed elsewhere starts its replay afresh.
- ``auto`` (the default): shared where the node sees the study's folder (the actor reads
  a random token the study wrote there), else copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import re
import shutil
import signal
import tarfile
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from torchbeast.core.files import write_whole
from torchbeast.runtime.ray.prepare import cannot_join, prepare_ray_environment
from torchbeast.runtime.training import TrainingError
from torchbeast.study import (
    Cell,
    CellJob,
    CellProcess,
    Resources,
    Study,
    StudyError,
    earlier_record,
    replacing,
    train_and_evaluate,
    write_state,
)

TOKEN_NAME = ".study_token"  # in the study's folder: how a node tells it sees the folder
LEFT_BEHIND = ("replay.tar",)  # not copied: up to --replay_checkpoint_gib each


def pack(folder: Path) -> bytes:
    """``folder``'s files as an uncompressed tar (checkpoints barely compress)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.name not in LEFT_BEHIND:
                tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


def unpack(archive: bytes, folder: Path) -> None:
    """Writes ``archive``'s files into ``folder`` (plain files under it only)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        tar.extractall(folder, filter="data")


def replace_folder(folder: Path, archive: bytes) -> None:
    """``folder`` becomes what ``archive`` holds; a crash midway leaves the old folder, or
    the new one, never a mix (files a run wrote in the old one are not lost: the archive
    started as a copy of it); one between the two renames leaves both beside it, and the
    study's next command puts the new one back (``finish_replacing``)."""
    incoming, outgoing = replacing(folder)
    shutil.rmtree(incoming, ignore_errors=True)
    unpack(archive, incoming)
    shutil.rmtree(outgoing, ignore_errors=True)
    for name in LEFT_BEHIND:  # kept where they are
        if (folder / name).exists():
            os.replace(folder / name, incoming / name)
    if folder.exists():
        os.replace(folder, outgoing)
    os.replace(incoming, folder)
    shutil.rmtree(outgoing, ignore_errors=True)


def plain(line: str) -> str:
    """A line of Ray's (or a cell's error) without terminal colours, at most 200
    characters (Ray's errors run long): for the study's table."""
    return re.sub(r"\x1b\[[0-9;]*m", "", line)[:200]


def study_token(study: Study) -> str:
    """The random token in the study's folder (written the first time)."""
    path = study.folder / TOKEN_NAME
    if not path.exists():
        write_whole(path, uuid.uuid4().hex)
    return path.read_text().strip()


class CellWorker:
    """One cell on the node Ray chose for it (a Ray actor: ``ray.remote`` below)."""

    def __init__(self) -> None:
        self.process = CellProcess()

    def where(self) -> dict[str, str]:
        import ray

        context = ray.get_runtime_context()
        return {"node": ray.util.get_node_ip_address(), "node_id": context.get_node_id()}

    def sees(self, savedir: str, token: str) -> bool:
        """Whether this node sees the study's folder (its token) at the same path."""
        try:
            return (Path(savedir) / TOKEN_NAME).read_text().strip() == token
        except OSError:
            return False

    def run(self, job: CellJob, archive: bytes | None) -> tuple[dict | None, bytes | None]:
        """Trains and evaluates the cell: in place (``archive`` None, shared storage), or
        in a temporary folder made from ``archive`` and sent back. Returns the cell's
        record (None if stopped) and, when copied, its folder."""
        if archive is None:
            return train_and_evaluate(job, self.process, self.where()), None
        workdir = tempfile.mkdtemp(prefix="torchbeast-study-")
        try:
            local = dataclasses.replace(job, savedir=workdir)
            unpack(archive, local.folder)
            state = train_and_evaluate(local, self.process, self.where())
            return state, pack(local.folder)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def stop(self) -> None:
        self.process.stop()


class ClusterCells:
    """A study's executor on a Ray cluster: every cell is handed over at once, and Ray
    runs as many as its nodes have resources for."""

    def __init__(self, study: Study, files: str, cells: int, nodes: int, cpus: float):
        import ray

        self.study, self.files = study, files
        self.parallel = max(1, cells)
        resources = study.resources
        gpus = f", {resources.gpus:g} GPU" if resources.gpus else ""
        self.where = (
            f"each with {resources.cpus} CPU(s){gpus}, on the Ray cluster's {nodes} node(s) "
            f"({cpus:g} CPUs in all)"
        )
        self.starting = "waiting for a node with its resources, then training and evaluating"
        self.token = study_token(study)
        self.worker_class = ray.remote(max_concurrency=2)(CellWorker)
        self.lock = threading.Lock()
        self.placing: set = set()  # workers Ray has yet to place, or that have yet to run
        self.running: set = set()
        self.stopping = False

    def run(self, cell: Cell, started: Callable[[], None]) -> dict | None:
        import ray

        resources = self.study.resources
        worker = self.worker_class.options(
            num_cpus=resources.cpus, num_gpus=resources.gpus
        ).remote()
        with self.lock:
            if self.stopping:
                ray.kill(worker)
                return None
            self.placing.add(worker)
        job = cell.job()
        try:
            # Returns once Ray has placed the cell on a node with its resources free.
            sees = ray.get(worker.sees.remote(job.savedir, self.token))
            if self.files == "shared" and not sees:
                where = ray.get(worker.where.remote())
                return self.record(
                    cell,
                    where,
                    f"node {where['node']} does not see the study's folder {job.savedir}: "
                    "mount it there at the same path, or use --files copy",
                )
            archive = None if sees and self.files != "copy" else pack(cell.folder)
            with self.lock:
                if self.stopping:
                    return None
                self.placing.discard(worker)
                self.running.add(worker)
                finished = worker.run.remote(job, archive)
            started()  # placed on a node: the table says it runs (queued, it did not)
            state, archive = ray.get(finished)
            if archive is not None:
                replace_folder(cell.folder, archive)
            return state
        except ray.exceptions.RayTaskError as error:  # the cell's own code raised, there
            cause = error.cause if isinstance(error.cause, BaseException) else error
            return self.record(cell, {}, plain(f"{type(cause).__name__}: {cause}"))
        except ray.exceptions.RayError as error:  # its node or worker died
            if self.stopping:
                return None  # killed by ``stop`` before it ran
            lines = [plain(line) for line in str(error).strip().splitlines()]
            return self.record(
                cell,
                {},
                f"the cell's Ray worker was lost ({(lines or [type(error).__name__])[0]}): "
                "run the study again to resume it",
            )
        finally:
            with self.lock:
                self.placing.discard(worker)
                self.running.discard(worker)
            ray.kill(worker)

    def record(self, cell: Cell, where: dict[str, str], error: str) -> dict:
        """Records a cell that failed around its run, in the study's own folder (where it
        ran, if known: not an earlier run's node)."""
        state = {**earlier_record(cell), "status": "failed", "error": error, **where}
        write_state(cell.folder, state)
        return state

    def stop(self) -> None:
        """Running cells stop (they checkpoint, and come back where copied); cells not yet
        running never start."""
        import ray

        with self.lock:
            self.stopping = True
            for worker in self.running:
                worker.stop.remote()
            for worker in self.placing:
                ray.kill(worker)


@contextlib.contextmanager
def cluster_cells(study: Study, address: str, files: str, cells: int) -> Iterator[ClusterCells]:
    """Joins the Ray cluster at ``address`` for the study's cells; leaves it at the end."""
    if study.runtime == "ray":
        raise StudyError(
            'a study on a Ray cluster runs each cell on one node: use runtime = "mono" '
            '(or "poly"); runtime = "ray" cells would compete with the study for its CPUs'
        )
    try:
        prepare_ray_environment(address, without="leave out --ray_address to run the cells here")
    except TrainingError as error:
        raise StudyError(str(error)) from None
    import ray  # here and in methods: only after prepare_ray_environment, as Ray reads it

    handler = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as error:
        raise StudyError(
            cannot_join(address, error, "leave out --ray_address to run the cells here")
        ) from None
    finally:
        signal.signal(signal.SIGTERM, handler)  # Ray's driver puts in its own, which aborts
    try:
        alive = [node for node in ray.nodes() if node.get("Alive")]
        check_fits(study.resources, alive)
        cpus = ray.cluster_resources().get("CPU", 0)
        yield ClusterCells(study, files, cells, len(alive), cpus)
    finally:
        ray.shutdown()


def check_fits(resources: Resources, nodes: list[dict]) -> None:
    """Refuses a cell that no node of the cluster could hold, its CPUs and GPUs on one node
    (Ray would queue it forever); ``nodes``: the live ones, as ``ray.nodes()`` gives them."""
    wanted = {"CPU": resources.cpus, "GPU": resources.gpus}
    has = [{name: node["Resources"].get(name, 0.0) for name in wanted} for node in nodes]
    if any(all(count <= node[name] for name, count in wanted.items()) for node in has):
        return
    for name, count in wanted.items():
        largest = max((node[name] for node in has), default=0.0)
        if count > largest:
            key = name.lower() + "s"
            raise StudyError(
                f"a cell asks for {count:g} {name}s ([resources] {key}) but the largest node "
                f"of the Ray cluster has {largest:g}: lower {key}, or add a node with them"
            )
    nodes_text = ", ".join(f"{node['CPU']:g} CPUs and {node['GPU']:g} GPUs" for node in has)
    raise StudyError(
        f"a cell asks for {resources.cpus:g} CPUs and {resources.gpus:g} GPUs on one node "
        f"([resources] cpus, gpus) but no node of the Ray cluster has both (its nodes: "
        f"{nodes_text}): lower them, or add a node with them"
    )
