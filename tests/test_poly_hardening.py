"""PolyBeast against hostile or broken peers: one peer can cost only its own stream.

Each test runs a real learner process on a Unix socket and does what an attacker or a
misconfigured client does, with a gRPC client written here from the proto, then checks that
training goes on (or that the learner stops with one line) and that nothing saved is lost.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch

from tests import warm_start
from tests.conftest import kill_groups, spawn
from tests.test_monobeast import read_rows
from tests.test_polybeast import (
    CARTPOLE,
    ENV,
    LEARNER,
    bad_stream,
    env_hello,
    logged_steps,
    step_of,
    text,
    wait_for,
)
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_learner_parser
from torchbeast.config.settings import build_settings
from torchbeast.core.models import create_model, model_config
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.poly import codec
from torchbeast.runtime.poly import polybeast_pb2 as pb
from torchbeast.runtime.poly import polybeast_pb2_grpc as pb_grpc
from torchbeast.runtime.poly.batching import Failed
from torchbeast.runtime.poly.learner_end import PolyActorPool
from torchbeast.runtime.poly.stream_limits import StreamClosed

PONG = EnvSpec("PongNoFrameskip-v4", (4, 84, 84), np.dtype("uint8"), 6)


def start_learner(processes, tmp_path, address, *extra, total_steps=3000, name="learner"):
    log = tmp_path / f"{name}.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--total_steps",
        str(total_steps), "--savedir", str(tmp_path), "--xpid", "r", *extra, log=log,
    )  # fmt: skip
    return learner, log


def start_client(processes, tmp_path, address, *extra):
    return processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1", *extra,
        log=tmp_path / "client.log",
    )  # fmt: skip


def playing_stream(
    address: str, spec: EnvSpec, make_step, steps: int, client_id: str
) -> grpc.RpcError | None:
    """A client that answers every Action with ``make_step(t)`` for ``steps`` steps; returns
    the error the learner closed its stream with (None if it never did)."""
    outgoing: queue.Queue = queue.Queue()
    outgoing.put(env_hello(client_id, spec))
    outgoing.put(make_step(0))
    with grpc.insecure_channel(address) as channel:
        call = pb_grpc.LearnerStub(channel).ConnectEnv(iter(outgoing.get, None), timeout=120)
        try:
            for t, _action in enumerate(call, start=1):
                if t >= steps:
                    break
                outgoing.put(make_step(t))
        except grpc.RpcError as error:
            return error
        finally:
            outgoing.put(None)
    return None


# Every sign pattern of the largest float32: each overflows some weights' sums.
HUGE_FRAMES = [[3.4e38 * (1 - 2 * (i >> bit & 1)) for bit in range(4)] for i in range(16)]


def cartpole_step(observation, reward: float = 0.0) -> pb.EnvMessage:
    message = step_of(np.asarray(observation, np.float32).reshape(1, 4))
    message.step.reward[0] = reward
    return message


# --------------------------------------------------------------------------- 1. extreme values


def attached_pool(tmp_path, *flags: str) -> PolyActorPool:
    """A CartPole learner's pool in this process, its model attached: streams can be served
    through ``serve_env`` without a network, and inference asked directly."""
    settings = build_settings(parse_flags([*LEARNER, *flags], make_learner_parser("")), "poly")
    pool = PolyActorPool(settings, spec=CARTPOLE)
    config = model_config(settings.model, CARTPOLE.observation_shape)
    pool.attach(create_model(config, (4,), 2), config, str(tmp_path))
    return pool


def serve(pool: PolyActorPool, messages: list[pb.EnvMessage]) -> int:
    """Plays ``messages`` on one stream through the pool; returns the actions it answered."""
    return sum(1 for _action in pool.serve_env(iter(messages), cancel=lambda: None))


def test_inference_rows_that_come_out_non_finite_fail_only_their_own_stream(tmp_path):
    pool = attached_pool(tmp_path)

    def request(observation: list[float]):
        inputs = dict(
            frame=torch.tensor([[observation]]),
            reward=torch.zeros(1, 1),
            done=torch.zeros(1, 1, dtype=torch.bool),
            last_action=torch.zeros(1, 1, dtype=torch.int64),
        )
        return inputs, ()

    try:
        good, bad, also_good = pool.inference.infer(
            [request([0.1] * 4), request([float("nan")] * 4), request([0.2] * 4)]
        )
    finally:
        pool.stop()
    assert isinstance(bad, Failed) and "non-finite outputs" in str(bad.error)
    for result in (good, also_good):
        outputs, _ = result
        assert outputs["action"].shape == (1,) and 0 <= int(outputs["action"][0]) < 2
        assert torch.isfinite(outputs["policy_logits"]).all()


def test_a_stream_whose_frame_breaks_inference_gives_the_learner_nothing(tmp_path):
    # Its partial rollout would hold that frame: the batch it joined would be dropped for a
    # non-finite loss, with the other streams' rollouts in it.
    torch.manual_seed(0)  # a model whose outputs the frames below overflow
    pool = attached_pool(tmp_path)
    frames = [[0.1] * 4, [0.2] * 4, *HUGE_FRAMES]
    try:
        with pytest.raises(StreamClosed, match="non-finite outputs"):
            serve(pool, [env_hello("huge", CARTPOLE), *map(cartpole_step, frames)])
        assert pool.queue.qsize() == 0
        assert not pool.watch.streams
    finally:
        pool.stop()


def test_a_stream_that_ends_right_after_a_whole_rollout_logs_its_episode_as_left(tmp_path):
    pool = attached_pool(tmp_path)  # --unroll_length 20
    steps = [cartpole_step([0.1] * 4) for _ in range(21)]  # the first frame, then 20 steps
    for t, message in enumerate(steps):
        message.step.episode_step[0], message.step.episode_return[0] = t, 0.5 * t
    try:
        assert serve(pool, [env_hello("whole", CARTPOLE), *steps]) == 21
        assert pool.queue.qsize() == 1  # the whole rollout, and no empty one after it
    finally:
        pool.stop()
    with open(tmp_path / "episodes.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["client_id"], r["episode_return"], r["episode_step"], r["end"]) for r in rows] == [
        ("whole", "10.0", "20", "disconnect")
    ]


def test_streams_closed_before_their_hello_leave_nothing_behind(tmp_path, sockets):
    pool = attached_pool(tmp_path, "--serve", f"unix:{sockets}/learner")
    pool.listen()
    try:
        with grpc.insecure_channel(f"unix:{sockets}/learner") as channel:
            stub = pb_grpc.LearnerStub(channel)
            for _ in range(20):
                assert list(stub.ConnectEnv(iter([]), timeout=30)) == []
        assert not pool.watch.streams  # each held its call and context for good
    finally:
        pool.stop()


def test_a_learner_told_nothing_takes_the_first_hello_and_says_so(tmp_path, processes, sockets):
    address = f"unix:{sockets}/learner"
    log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER[2:], "--serve", address, "--total_steps",
        "400", "--savedir", str(tmp_path), "--xpid", "r", log=log,
    )  # fmt: skip
    start_client(processes, tmp_path, address)
    assert learner.wait(timeout=120) == 0, text(log)
    assert "not told the environment (--env), so the first one to connect decides" in text(log)


def test_a_resumed_learner_refuses_peers_of_another_spec_and_keeps_its_checkpoint(
    tmp_path, processes, sockets
):
    address = f"unix:{sockets}/learner"
    first, log = start_learner(processes, tmp_path, address, total_steps=200, name="first")
    start_client(processes, tmp_path, address, "--client_steps", "400")
    assert first.wait(timeout=120) == 0, text(log)
    checkpoint = tmp_path / "r" / "model.tar"
    saved = checkpoint.read_bytes()
    # Resumed without --env: the checkpoint says what the run is.
    second_log = tmp_path / "second.log"
    second = processes(
        "torchbeast.polybeast_learner", *LEARNER[2:], "--serve", address, "--total_steps",
        "600", "--savedir", str(tmp_path), "--xpid", "r", log=second_log,
    )  # fmt: skip
    wait_for(lambda: "Resuming r" in text(second_log), 60, "the learner to read its checkpoint")
    # Serving starts just after that line: a stream sooner would find no server.
    wait_for(lambda: "Learner serving env clients on" in text(second_log), 60, "serving")
    other = EnvSpec("CartPole-v1", (4,), np.dtype("float32"), 3)
    error = bad_stream(address, [env_hello("other", other)], token=None)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "(float32 [4], 3 actions) does not match" in error.details()
    assert checkpoint.read_bytes() == saved
    start_client(processes, tmp_path, address)
    assert second.wait(timeout=120) == 0, text(second_log)
    assert "Traceback" not in text(second_log)
    assert logged_steps(tmp_path / "r")[-1] >= 600


# --------------------------------------------------------------------------- 4. memory, idle


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_idle_streams_are_closed_and_free_their_slot(tmp_path, processes, sockets):
    address = f"unix:{sockets}/learner"
    learner, log = start_learner(
        processes, tmp_path, address, "--max_clients", "2", "--stream_timeout_s", "2",
        total_steps=100_000,
    )  # fmt: skip
    wait_for(lambda: os.path.exists(f"{sockets}/learner"), 60, "the learner to listen")
    silent: queue.Queue = queue.Queue()  # connects, says nothing
    idle: queue.Queue = queue.Queue()  # a Hello and a first Step, then nothing
    idle.put(env_hello("idle", CARTPOLE))
    idle.put(cartpole_step([0.0] * 4))
    errors: dict[str, grpc.RpcError] = {}

    def hold(name: str, requests: queue.Queue) -> None:
        with grpc.insecure_channel(address) as channel:
            call = pb_grpc.LearnerStub(channel).ConnectEnv(iter(requests.get, None), timeout=60)
            try:
                for _ in call:
                    pass
            except grpc.RpcError as error:
                errors[name] = error

    threads = [
        threading.Thread(target=hold, args=("silent", silent)),
        threading.Thread(target=hold, args=("idle", idle)),
    ]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    start_client(processes, tmp_path, address)  # the third stream: waits for a slot
    for thread in threads:
        thread.join(timeout=40)
    assert set(errors) == {"silent", "idle"}, errors
    assert time.monotonic() - start < 20  # the Hello timeout is 10 s, the Step one 2 s
    # The client sees its stream cancelled a moment before the learner's thread logs why.
    for reason in ("sent no Hello within 10 s", "sent no Step for 2 s"):
        wait_for(lambda reason=reason: reason in text(log), 10, f"the learner to log {reason!r}")
    # The client that waited for a slot was told why, and got one, and trains.
    assert "unavailable (RESOURCE_EXHAUSTED: " in text(tmp_path / "client.log")
    steps = len(logged_steps(tmp_path / "r"))
    wait_for(lambda: len(logged_steps(tmp_path / "r")) > steps + 5, 60, "training to go on")
    assert learner.poll() is None
    learner.terminate()
    assert learner.wait(timeout=60) == 128 + signal.SIGTERM, text(log)


# --------------------------------------------------------------------------- 7. start-up errors


def test_an_unknown_env_stops_the_serving_learner_at_once_with_one_line(tmp_path, sockets):
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", "--env", "NoSuchEnv-v0",
         "--serve", f"unix:{sockets}/learner", "--savedir", str(tmp_path)],
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "NoSuchEnv-v0" in lines[0], result.stderr


def test_an_unwritable_savedir_stops_the_learner_before_any_client(tmp_path, sockets):
    blocker = tmp_path / "a-file"  # a --savedir below a file cannot be made, even by root
    blocker.write_text("")
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", *LEARNER,
         "--serve", f"unix:{sockets}/learner", "--savedir", str(blocker / "runs")],
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Not a directory" in lines[0], result.stderr
    assert not os.path.exists(f"{sockets}/learner")  # it never listened


# --------------------------------------------------------------------------- 8. quiet failures


def raw_stream(address: str, payloads: list[bytes]) -> grpc.RpcError:
    """Sends bytes that need not be a protobuf message at all."""
    with grpc.insecure_channel(address) as channel:
        connect = channel.stream_stream(
            "/torchbeast.polybeast.Learner/ConnectEnv",
            request_serializer=lambda data: data,
            response_deserializer=pb.Action.FromString,
        )
        with pytest.raises(grpc.RpcError) as error:
            list(connect(iter(payloads), timeout=30))
    return error.value


def nested(depth: int) -> bytes:
    """A Step whose observation is an ArrayNest nested ``depth`` deep, as raw bytes."""

    def length_delimited(field: int, payload: bytes) -> bytes:
        size, varint = len(payload), b""
        while True:
            byte, size = size & 0x7F, size >> 7
            varint += bytes([byte | (0x80 if size else 0)])
            if not size:
                break
        return bytes([field << 3 | 2]) + varint + payload

    nest = b""
    for _ in range(depth):
        nest = length_delimited(2, nest)  # ArrayNest.vector
    step = length_delimited(1, nest)  # Step.observation
    return length_delimited(2, step)  # EnvMessage.step


class FailingEnvServer(pb_grpc.EnvServerServicer):
    """An env server that fails each stream it is dialled on with the next of ``codes``,
    then with the last of them."""

    def __init__(self, codes: list[grpc.StatusCode]):
        self.codes = codes

    def StreamEnv(self, request_iterator, context):  # noqa: N802 (gRPC's name)
        code = self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]
        context.abort(code, f"failed with {code.name}")


def test_a_learner_redialling_a_failing_env_server_logs_each_new_reason(tmp_path, sockets, caplog):
    from concurrent import futures

    from torchbeast.runtime.poly.dialling import dial

    address = f"unix:{sockets}/env"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    codes = [grpc.StatusCode.INTERNAL] * 2 + [grpc.StatusCode.DATA_LOSS] * 2
    pb_grpc.add_EnvServerServicer_to_server(FailingEnvServer(codes), server)
    server.add_insecure_port(address)
    server.start()
    pool = attached_pool(tmp_path)
    channel = grpc.insecure_channel(address)
    dialling = threading.Thread(target=dial, args=(pool, address, channel, ()))
    try:
        with caplog.at_level("INFO", logger="torchbeast"):
            dialling.start()
            wait_for(lambda: "DATA_LOSS" in caplog.text, 30, "the second reason in the log")
    finally:
        pool.stop()
        dialling.join(timeout=30)
        channel.close()
        server.stop(grace=None)
    said = [r.getMessage() for r in caplog.records if "redialling" in r.getMessage()]
    assert said == [
        f"Env server {address}: INTERNAL; redialling.",
        f"Env server {address}: DATA_LOSS; redialling.",
    ]


# --------------------------------------------------------------------------- shared learners
# Hostile streams take turns at one long-running learner per module (starting one costs
# seconds); each test then checks that it still trains.


class Running:
    """A learner process serving on ``address``, its run folder and log."""

    def __init__(self, address: str, folder, learner: subprocess.Popen):
        self.address, self.folder, self.learner = address, folder, learner
        self.log = folder / "learner.log"

    def output(self) -> str:
        return text(self.log)

    def assert_still_trains(self) -> None:
        steps = len(logged_steps(self.folder / "r"))
        wait_for(lambda: len(logged_steps(self.folder / "r")) > steps + 3, 60, "training to go on")
        assert self.learner.poll() is None
        assert "Traceback" not in self.output()


class Paused:
    """A run whose processes are stopped (SIGSTOP to their groups) but while a test uses
    it: a CartPole learner and its client train on most of a core, which every other test
    on the machine would pay for while the module's tests come and go."""

    def __init__(self, running: Running, processes: list[subprocess.Popen]):
        self.running, self.processes = running, processes
        self.signal(signal.SIGSTOP)

    def signal(self, number: int) -> None:
        for process in self.processes:
            os.killpg(process.pid, number)

    @contextlib.contextmanager
    def going_on(self) -> Iterator[Running]:
        self.signal(signal.SIGCONT)
        try:
            yield self.running
        finally:
            self.signal(signal.SIGSTOP)


@pytest.fixture(scope="module")
def cartpole_training(tmp_path_factory):
    """A CartPole learner (rewards not clipped) training with one good client. Its streams
    may wait for a Step as long as the module's tests take, since it is paused meanwhile."""
    folder = tmp_path_factory.mktemp("cartpole")
    sockets = tempfile.mkdtemp(prefix="pb", dir="/tmp")
    address = f"unix:{sockets}/learner"
    learner = spawn(
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--reward_clipping",
        "none", "--total_steps", "100000000", "--stream_timeout_s", "3600", "--savedir",
        str(folder), "--xpid", "r", log=folder / "learner.log",
    )  # fmt: skip
    client = spawn(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        log=folder / "client.log",
    )  # fmt: skip
    try:
        wait_for(lambda: logged_steps(folder / "r"), 90, "training to start")
        yield Paused(Running(address, folder, learner), [client, learner])
    finally:
        kill_groups([learner, client])
        shutil.rmtree(sockets, ignore_errors=True)


@pytest.fixture
def cartpole_run(cartpole_training):
    """The CartPole run, training while the test runs."""
    with cartpole_training.going_on() as running:
        yield running


@pytest.fixture(scope="module")
def pong_learner(tmp_path_factory):
    """A Pong learner with a 4 MiB budget for streams, and no client."""
    folder = tmp_path_factory.mktemp("pong")
    sockets = tempfile.mkdtemp(prefix="pb", dir="/tmp")
    address = f"unix:{sockets}/learner"
    learner = spawn(
        "torchbeast.polybeast_learner", "--env", "PongNoFrameskip-v4", "--disable_cuda",
        "--serve", address, "--savedir", str(folder), "--xpid", "r", "--stream_memory_mb", "4",
        log=folder / "learner.log",
    )  # fmt: skip
    try:
        running = Running(address, folder, learner)
        wait_for(lambda: "at most 4 MiB" in running.output(), 90, "the learner to start")
        yield running
    finally:
        kill_groups([learner])
        shutil.rmtree(sockets, ignore_errors=True)


def test_finite_but_huge_observations_cost_their_stream_not_the_run(cartpole_run):
    error = playing_stream(
        cartpole_run.address, CARTPOLE, lambda t: cartpole_step(HUGE_FRAMES[t % 16]), 200, "huge"
    )
    assert error is not None, "the learner never closed the stream"
    # Closed at inference (ABORTED) or, if its outputs stayed finite, when its rollout
    # made the loss non-finite (the learner cancels the stream, then logs it: the client
    # may see the stream end before the line is written).
    wait_for(
        lambda: any(
            line in cartpole_run.output()
            for line in ("non-finite outputs", "Closed the streams of huge")
        ),
        10,
        "the line that says why the stream was closed",
    )
    cartpole_run.assert_still_trains()


def test_rollouts_that_make_the_loss_non_finite_are_dropped_and_their_stream_closed(
    cartpole_run,
):
    # Plays well-formed CartPole steps with a finite reward that no loss can square.
    error = playing_stream(
        cartpole_run.address, CARTPOLE, lambda t: cartpole_step([0.0] * 4, reward=3e38), 2000,
        "rich",
    )  # fmt: skip
    assert error is not None, "the learner never closed the stream"
    wait_for(lambda: "Closed the streams of rich." in cartpole_run.output(), 10, "the warning")
    cartpole_run.assert_still_trains()
    rows = read_rows(cartpole_run.folder / "r" / "logs.csv")
    assert all(np.isfinite(float(row["total_loss"])) for row in rows)


def test_a_peer_that_breaks_the_loss_again_and_again_neither_stops_nor_stalls_the_run(
    tmp_path, sockets
):
    # Each time its stream was closed it came back: alone, it stopped the run ("none of the
    # first 100 batches could be learnt from"); beside a good client, every batch it was in
    # was dropped, and the run learnt nothing more, with two warnings a batch.
    address = f"unix:{sockets}/learner"
    learner = spawn(
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--reward_clipping",
        "none", "--total_steps", "100000000", "--savedir", str(tmp_path), "--xpid", "r",
        log=tmp_path / "learner.log",
    )  # fmt: skip
    running, started = Running(address, tmp_path, learner), []
    stop = threading.Event()

    def come_back_again_and_again() -> None:
        while not stop.is_set():
            rich = lambda t: cartpole_step([0.0] * 4, reward=3e38)  # noqa: E731
            started.append(playing_stream(address, CARTPOLE, rich, 100, "rich"))

    wait_for(lambda: os.path.exists(f"{sockets}/learner"), 60, "the learner to listen")
    flood = threading.Thread(target=come_back_again_and_again)
    flood.start()
    client = None
    try:
        wait_for(lambda: len(started) > 150, 120, "150 streams of the peer")
        assert learner.poll() is None, running.output()
        client = spawn(
            "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
            log=tmp_path / "client.log",
        )  # fmt: skip
        wait_for(lambda: sum(logged_steps(tmp_path / "r")[-1:]) > 1500, 120, "learning to go on")
    finally:
        stop.set()
        flood.join(timeout=60)
        kill_groups([learner, *([client] if client else [])])
    output = running.output()
    assert "Learnt from a batch without the rollouts of rich/0" in output
    assert "more batches dropped or learnt from in part in the last" in output  # a count
    assert output.count("Dropped a batch") + output.count("Learnt from a batch") < len(started)
    assert "Traceback" not in output


def test_a_learner_told_its_env_refuses_a_hello_that_disagrees(cartpole_run):
    liar = EnvSpec("CartPole-v1", (5,), np.dtype("float32"), 3)
    error = bad_stream(cartpole_run.address, [env_hello("liar", liar)], token=None)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "CartPole-v1 (float32 [5], 3 actions)" in error.details()
    assert "the run's CartPole-v1 (float32 [4], 2 actions)" in error.details()
    assert "decides" not in cartpole_run.output()  # told its env: no Hello decides it
    cartpole_run.assert_still_trains()


def test_a_learner_refuses_a_hello_whose_episode_extras_are_not_the_runs(cartpole_run):
    reporting = dataclasses.replace(CARTPOLE, episode_extras=("coins",))
    error = bad_stream(cartpole_run.address, [env_hello("coins", reporting)], token=None)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "CartPole-v1 (float32 [4], 2 actions, episode extras coins)" in error.details()
    assert "the run's CartPole-v1 (float32 [4], 2 actions)" in error.details()
    cartpole_run.assert_still_trains()


@pytest.mark.parametrize("num_actions", [1_000_000, 2**31 - 1])
def test_a_hello_with_a_huge_action_count_is_refused(cartpole_run, num_actions):
    spec = EnvSpec("CartPole-v1", (4,), np.dtype("float32"), num_actions)
    error = bad_stream(cartpole_run.address, [env_hello("greedy", spec)], token=None)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"num_actions {num_actions} is not in [1, 4096]" in error.details()
    cartpole_run.assert_still_trains()


def test_messages_that_do_not_parse_are_refused_and_logged(cartpole_run):
    assert pb.ArrayNest.DESCRIPTOR.fields_by_name["vector"].number == 2
    address = cartpole_run.address
    hello = env_hello("client", CARTPOLE).SerializeToString()
    garbage = {
        "random bytes": raw_stream(address, [b"\xff" * 10 + b"\x01"]),
        "nested 150 deep": raw_stream(address, [hello, nested(150)]),
    }
    codes = {name: error.code() for name, error in garbage.items()}
    assert set(codes.values()) == {grpc.StatusCode.INVALID_ARGUMENT}, garbage
    wait_for(lambda: cartpole_run.output().count("could not be parsed") == 2, 10, "both logged")
    cartpole_run.assert_still_trains()


def test_bare_hellos_cost_the_learner_no_memory(pong_learner):
    time.sleep(1)
    before = rss_mib(pong_learner.learner.pid)
    held = []
    for i in range(8):  # each announces 128 Pong envs: 131 MiB of buffers if allocated
        requests: queue.Queue = queue.Queue()
        requests.put(env_hello(f"bare-{i}", PONG, 128))
        channel = grpc.insecure_channel(pong_learner.address)
        held.append(
            (channel, requests, pb_grpc.LearnerStub(channel).ConnectEnv(iter(requests.get, None)))
        )
    wait_for(lambda: pong_learner.output().count("connected (128 envs)") == 8, 30, "the Hellos")
    after = rss_mib(pong_learner.learner.pid)
    for channel, requests, _ in held:
        requests.put(None)
        channel.close()
    assert after - before < 50, (before, after)


def pong_step(num_envs: int) -> pb.EnvMessage:
    frames = np.zeros((num_envs, *PONG.observation_shape), np.uint8)
    return pb.EnvMessage(
        step=pb.Step(
            observation=pb.ArrayNest(array=codec.encode_array(frames)),
            **{name: [0] * num_envs for name in codec.STEP_FIELDS},
        )
    )


def test_a_stream_beyond_the_whole_memory_budget_is_refused_for_good(pong_learner):
    # It was RESOURCE_EXHAUSTED, "the memory is spent (0 of 4 MiB)": its client retried for
    # ever, for memory no wait could free.
    error = bad_stream(pong_learner.address, [env_hello("big", PONG, 64), pong_step(64)], None)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert re.fullmatch(
        r"big's stream needs [\d.]+ MiB for its rollout buffers, more than the learner's "
        r"memory for all env streams \(4 MiB\): give the learner a larger --stream_memory_mb, "
        r"or the stream fewer envs \(--envs_per_stream\) or a shorter --unroll_length",
        error.details(),
    ), error.details()
    assert pong_learner.learner.poll() is None


def test_a_stream_beyond_what_is_left_of_the_budget_is_told_to_come_back(pong_learner):
    held: queue.Queue = queue.Queue()
    held.put(env_hello("first", PONG, 20))
    held.put(pong_step(20))
    with grpc.insecure_channel(pong_learner.address) as channel:
        first = pb_grpc.LearnerStub(channel).ConnectEnv(iter(held.get, None), timeout=60)
        next(first)  # its first action: its buffers are reserved
        second = [env_hello("second", PONG, 20), pong_step(20)]
        error = bad_stream(pong_learner.address, second, token=None)
        held.put(None)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the learner's memory for env streams is spent" in error.details()
    assert pong_learner.learner.poll() is None


# --------------------------------------------------------------------------- 9. a peer's strings

HUGE = "x" * 2**20
FORGED = "ok\n[WARNING:1 2026-01-01 00:00:00,000] FORGED"


def streams_carrying(text: str) -> dict[str, list[pb.EnvMessage]]:
    """One stream per string field of the protocol, with ``text`` in that field."""

    def hello() -> pb.EnvMessage:
        return env_hello("strings", CARTPOLE)

    def step() -> pb.EnvMessage:
        return step_of(np.zeros((1, 4), np.float32))

    streams = {name: [hello()] for name in ("client_id", "env_id", "dtype", "episode_extras")}
    streams["client_id"][0].hello.client_id = text
    streams["env_id"][0].hello.env_id = text
    streams["dtype"][0].hello.observation_spec.dtype = text
    streams["episode_extras"][0].hello.episode_extras.append(text)
    for name in ("step dtype", "step map key", "step episode_extras"):
        streams[name] = [hello(), step()]
    streams["step dtype"][1].step.observation.array.dtype = text
    observation = streams["step map key"][1].step.observation
    observation.map[text].CopyFrom(pb.ArrayNest(array=observation.array))
    observation.ClearField("array")
    streams["step episode_extras"][1].step.episode_extras[text].values.append(0.0)
    return streams


def test_a_hello_of_a_hundred_thousand_dimensions_is_refused_in_a_short_line(cartpole_run):
    many = EnvSpec("CartPole-v1", (1,) * 100_000, np.dtype("float32"), 2)
    error = bad_stream(cartpole_run.address, [env_hello("dims", many)], token=None)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "an observation of 100000 dimensions is not allowed (at most 8)" in error.details()
    cartpole_run.assert_still_trains()


@pytest.mark.parametrize("text", [HUGE, FORGED], ids=["1 MiB", "newline"])
def test_a_peers_strings_reach_the_log_and_its_status_bounded_and_escaped(cartpole_run, text):
    for field, messages in streams_carrying(text).items():
        error = bad_stream(cartpole_run.address, messages, token=None)
        details = error.details()
        assert error.code() in (
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.FAILED_PRECONDITION,
        ), (field, error.code(), details[:300])
        assert len(details) < 1000 and "\n" not in details, field
        assert "xxx" not in details or "(1048576 chars)" in details, field
    time.sleep(1)  # the last refusal's line
    lines = cartpole_run.output().splitlines()
    assert max(len(line) for line in lines) < 1000
    assert not any(line.startswith("[WARNING:1 2026-01-01") for line in lines)
    if text == HUGE:
        assert any("(1048576 chars)" in line for line in lines)
    else:
        assert any("'ok\\n[WARNING:1 2026-01-01" in line for line in lines)
    cartpole_run.assert_still_trains()
