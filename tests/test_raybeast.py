"""RayBeast end to end: a real local Ray instance (embedded, or started by the test with
`ray start --head` on 127.0.0.1), real Ray actor processes, real environments."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from tests import warm_start
from tests.test_batches import SLOW_SECOND_ACTOR
from tests.test_monobeast import (
    REPO,
    SMALL_RUN,
    assert_one_error_line,
    read_rows,
    wait_for,
    wait_for_rows,
)
from tests.test_riverraid import assert_fuel_proxy_logged, steer_right

BIN = os.path.dirname(sys.executable)
# A single-machine cluster: Ray's servers listen on 127.0.0.1 only.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def raybeast_command(tmp_path, *args: str) -> list[str]:
    return [sys.executable, "-m", "torchbeast.raybeast", "--savedir", str(tmp_path), *args]


def raybeast(tmp_path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return warm_start.run(raybeast_command(tmp_path, *args), timeout=timeout)


def pids_whose(name: str, matches) -> list[int]:
    """Live processes whose /proc/PID/``name`` file satisfies ``matches``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/{name}") as f:
                if matches(f.read()):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def rollout_actor_pids() -> list[int]:
    """Ray worker processes running our RolloutActor."""
    return pids_whose("cmdline", lambda cmdline: cmdline.startswith("ray::RolloutActor"))


def ray_daemon_pids() -> list[int]:
    """raylet and gcs_server processes."""
    return pids_whose("comm", lambda name: name.strip() in ("raylet", "gcs_server"))


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head on 127.0.0.1 in a temp dir, as a user starts one: `ray start --head`."""
    port = 6400 + os.getpid() % 500
    # Ray's socket paths must stay short: a temp dir under /tmp, not pytest's.
    temp_dir = tempfile.mkdtemp(prefix="rb-", dir="/tmp")
    env = os.environ | LOOPBACK
    start = [
        os.path.join(BIN, "ray"),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    started = subprocess.run(start, env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop = [os.path.join(BIN, "ray"), "stop", "--force"]
        subprocess.run(stop, env=env, capture_output=True, timeout=120)


def test_embedded_ray_trains_and_shuts_down(tmp_path, monkeypatch):
    # Without --ray_address it starts its own Ray even where the environment names a
    # cluster, as a Ray job's driver has it (Ray would join that one, refusing num_cpus).
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    before = set(ray_daemon_pids())  # the test cluster's, if it is up
    result = raybeast(
        tmp_path,
        *SMALL_RUN,
        "--total_steps",
        "20000",
        "--xpid",
        "run",
        "--suppress_logs",
        "--episodes_for_avg",
        "20",
    )
    assert result.returncode == 0, result.stderr
    rows = read_rows(tmp_path / "run" / "logs.csv")
    assert int(rows[-1]["step"]) >= 20000
    assert (tmp_path / "run" / "model.tar").exists()
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert "Connected to a local Ray instance (127.0.0.1)" in out_log
    # --suppress_logs: the console has progress lines only (out.log keeps the rest).
    console = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert console, result.stdout
    assert all("] Steps " in line for line in console), console
    assert any("Mean return (last " in line for line in console), console
    wait_for(lambda: set(ray_daemon_pids()) <= before, 30, "the local Ray instance to stop")
    assert not rollout_actor_pids()


def test_trains_on_a_running_cluster_and_resumes(tmp_path, ray_cluster):
    common = [*SMALL_RUN, "--ray_address", ray_cluster, "--xpid", "run"]
    first = raybeast(tmp_path, *common, "--total_steps", "4000")
    assert first.returncode == 0, first.stderr
    assert f"Connected to the Ray cluster at {ray_cluster}" in first.stdout
    steps = int(read_rows(tmp_path / "run" / "logs.csv")[-1]["step"])

    second = raybeast(tmp_path, *common, "--total_steps", "8000")
    assert second.returncode == 0, second.stderr
    assert f"Resuming from {tmp_path / 'run' / 'model.tar'} (step {steps}," in second.stdout
    rows = read_rows(tmp_path / "run" / "logs.csv")
    assert int(rows[-1]["step"]) >= 8000
    # The same xpid with another environment: one line, and the checkpoint is kept.
    saved = (tmp_path / "run" / "model.tar").read_bytes()
    other = raybeast(tmp_path, *common, "--env", "Acrobot-v1")
    assert_one_error_line(other, "trained on CartPole-v1, not Acrobot-v1", "--env CartPole-v1")
    assert (tmp_path / "run" / "model.tar").read_bytes() == saved
    # The cluster is the user's: it keeps running after the run.
    assert ray_daemon_pids()


def test_laser_replay_of_an_lstm_on_a_running_cluster(tmp_path, ray_cluster):
    result = raybeast(
        tmp_path,
        *SMALL_RUN,
        "--use_lstm",
        "--ray_address",
        ray_cluster,
        "--xpid",
        "run",
        "--total_steps",
        "6000",
        "--replay_size",
        "2000",
        "--replay_ratio",
        "3",
        "--learn_start",
        "400",
    )
    assert result.returncode == 0, result.stderr
    rows = read_rows(tmp_path / "run" / "logs.csv")
    replayed = [int(row["replayed_columns"]) for row in rows]
    assert replayed[0] == 0  # fewer than --learn_start transitions yet
    assert replayed[-1] == 3 * 4  # B * replay_ratio
    assert 0.0 <= float(rows[-1]["trusted_fraction"]) <= 1.0
    assert int(rows[-1]["step"]) - int(rows[-2]["step"]) == 4 * 20  # online steps only


def test_killed_ray_actor_is_replaced_and_training_goes_on(tmp_path, ray_cluster):
    command = raybeast_command(
        tmp_path, *SMALL_RUN, "--ray_address", ray_cluster, "--total_steps", "10000000"
    )
    command += ["--xpid", "run"]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        logs = tmp_path / "run" / "logs.csv"
        wait_for_rows(logs, 3)
        # One actor can fill the first batches while the other's worker still starts.
        wait_for(lambda: len(rollout_actor_pids()) == 2, 60, "both Ray actors")
        victims = rollout_actor_pids()
        os.kill(victims[0], signal.SIGKILL)
        wait_for(
            lambda: len(rollout_actor_pids()) == 2 and victims[0] not in rollout_actor_pids(),
            60,
            "a new Ray actor",
        )
        rows_after_kill = len(read_rows(logs))
        wait_for_rows(logs, rows_after_kill + 20)
        out_log = (tmp_path / "run" / "out.log").read_text()
        assert "died" in out_log and "starting a new one" in out_log
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert (tmp_path / "run" / "model.tar").exists()
    wait_for(lambda: not rollout_actor_pids(), 30, "the run's Ray actors to go")


@pytest.mark.parametrize(
    "address, fragment",
    [
        ("127.0.0.1:1", "cannot reach a Ray cluster at --ray_address 127.0.0.1:1"),
        ("nonsense", "is not host:port"),
    ],
)
def test_bad_ray_address_is_one_clear_error(tmp_path, address, fragment):
    result = raybeast(tmp_path, *SMALL_RUN, "--ray_address", address, timeout=60)
    assert_one_error_line(result, fragment)


def test_joining_without_the_clusters_token_says_what_to_set(tmp_path, ray_cluster):
    # "Start one with `ray start --head`": the cluster was there, this machine lacked its
    # token (or the head ran without token authentication, which Ray also refuses so).
    home = tmp_path / "home"
    home.mkdir()  # no ~/.ray/auth_token
    unset = ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
    env = {k: v for k, v in os.environ.items() if k not in unset} | {"HOME": str(home)}
    command = raybeast_command(tmp_path, *SMALL_RUN, "--ray_address", ray_cluster)
    result = warm_start.run(command, timeout=120, env=env)
    assert_one_error_line(
        result,
        f"cannot join the Ray cluster at --ray_address {ray_cluster}: ",
        "Give this machine the head's token (RAY_AUTH_TOKEN, or ~/.ray/auth_token",
        "set RAY_AUTH_MODE=disabled here",
    )


GIVE_THE_GCS = "give the head's address as `ray start --head` printed it"


def test_a_ray_client_url_is_refused_with_the_address_to_give(tmp_path):
    # Ray Client's ray://, or the dashboard's http:// that `ray job submit` takes.
    for url in ("ray://127.0.0.1:10001", "http://127.0.0.1:8265"):
        result = raybeast(tmp_path, *SMALL_RUN, "--ray_address", url, timeout=60)
        assert_one_error_line(result, f"--ray_address {url} is a URL: torchbeast joins a cluster")
        assert GIVE_THE_GCS in result.stderr


@pytest.fixture
def http_server():
    """An HTTP/1 server on 127.0.0.1, as Ray's dashboard is."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_dashboards_port_is_refused_in_seconds(tmp_path, http_server):
    # Ray's driver retried it for ~20 s, then said to start a cluster with `ray start`.
    started = time.monotonic()
    result = raybeast(tmp_path, *SMALL_RUN, "--ray_address", http_server, timeout=60)
    assert_one_error_line(result, f"--ray_address {http_server} is an HTTP server")
    assert GIVE_THE_GCS in result.stderr
    assert time.monotonic() - started < 15


@contextlib.contextmanager
def grpc_server_without_methods(host: str) -> Iterator[str]:
    """A real gRPC server on ``host`` that serves no method; yields its host:port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    try:
        yield f"{host}:{port}"
    finally:
        server.stop(None)


def test_an_ipv6_ray_address_is_written_in_brackets_as_ray_writes_it(monkeypatch):
    from torchbeast.runtime.ray import prepare
    from torchbeast.runtime.training import TrainingError

    assert prepare.split_address("[::1]:6379", "it") == ("::1", 6379)
    with pytest.raises(TrainingError, match=r"^--ray_address ::1:6379: write an IPv6 host in "):
        prepare.prepare_ray_environment("::1:6379")
    # Reached over IPv6, and asked over gRPC, at the address as given: a real gRPC server
    # that is not Ray's GCS is refused as one.
    with grpc_server_without_methods("[::1]") as address:
        with pytest.raises(TrainingError, match="is a Ray server but not the cluster's GCS"):
            prepare.check_reachable(address, "it")


def test_an_address_that_auto_found_is_named_with_where_it_was_found(monkeypatch):
    from torchbeast.runtime.ray import prepare
    from torchbeast.runtime.training import TrainingError

    monkeypatch.setenv("RAY_ADDRESS", "localhost")
    with pytest.raises(
        TrainingError,
        match=r"^the address localhost that --ray_address auto found in \$RAY_ADDRESS is not "
        "host:port",
    ):
        prepare.prepare_ray_environment("auto")


def test_a_grpc_server_that_is_not_rays_gcs_is_refused(monkeypatch):
    # As Ray Client's port (10001) or a raylet's answer: a real gRPC server without the
    # GCS's methods.
    from torchbeast.runtime.ray import prepare
    from torchbeast.runtime.training import TrainingError

    with grpc_server_without_methods("127.0.0.1") as address:
        with pytest.raises(TrainingError, match="is a Ray server but not the cluster's GCS"):
            prepare.check_reachable(address, "it")


def test_a_server_that_takes_connections_and_never_answers_is_refused(monkeypatch):
    # Ray retried it for ever (a study hung, printing Ray's "Failed to get cluster ID").
    from torchbeast.runtime.ray import prepare
    from torchbeast.runtime.training import TrainingError

    monkeypatch.setattr(prepare, "ANSWER_TIMEOUT_S", 1.0)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the backlog), no word
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(
            TrainingError,
            match=r"^it is a server that takes connections but did not answer in 1 s \(a "
            r"cluster's GCS answers at once\): give the head's address",
        ):
            prepare.check_reachable(address, "it")
    with pytest.raises(TrainingError, match=r"or leave out --ray_address to run the cells here"):
        prepare.check_reachable(address, "it", "leave out --ray_address to run the cells here")


def test_test_mode_plays_the_trained_model(tmp_path, ray_cluster):
    trained = raybeast(
        tmp_path, *SMALL_RUN, "--ray_address", ray_cluster, "--total_steps", "2000", "--xpid", "run"
    )
    assert trained.returncode == 0, trained.stderr
    tested = raybeast(
        tmp_path, *SMALL_RUN, "--mode", "test", "--xpid", "run", "--num_episodes", "2"
    )
    assert tested.returncode == 0, tested.stderr
    assert "Average returns over 2 episodes" in tested.stdout


def test_actors_that_keep_dying_stop_training_with_one_line(tmp_path, ray_cluster):
    result = raybeast(
        tmp_path,
        *SMALL_RUN,
        "--ray_address",
        ray_cluster,
        "--env",
        "tests.envs_for_tests:SelfKilling-v0",
        "--total_steps",
        "1000000",
        "--xpid",
        "run",
    )
    assert_one_error_line(result, "actors keep dying")
    assert (tmp_path / "run" / "model.tar").exists()


def test_an_actor_that_raises_stops_training_with_one_line(tmp_path, ray_cluster):
    result = raybeast(
        tmp_path,
        *SMALL_RUN,
        "--ray_address",
        ray_cluster,
        "--env",
        "tests.envs_for_tests:Raising-v0",
        "--total_steps",
        "1000000",
        "--xpid",
        "run",
    )
    assert_one_error_line(result, "failed", "the emulator crashed", "out.log")
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert 'envs_for_tests.py", line' in out_log  # the traceback


def test_an_env_module_only_the_driver_can_import_names_the_fix(tmp_path, ray_cluster):
    # The module is on the driver's PYTHONPATH alone, not on the one the cluster's nodes
    # were started with.
    (tmp_path / "only_here").mkdir()
    (tmp_path / "only_here" / "driver_side_envs.py").write_text(
        "import gymnasium as gym\n"
        'gym.register("DriverCart-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")\n'
    )
    env = os.environ | {"PYTHONPATH": str(tmp_path / "only_here")}
    command = raybeast_command(
        tmp_path,
        *SMALL_RUN,
        "--ray_address",
        ray_cluster,
        "--env",
        "driver_side_envs:DriverCart-v0",
    )
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert_one_error_line(
        result,
        "failed: torchbeast.envs.registry.EnvError: a Ray worker on 127.0.0.1 cannot import",
        "what the driver could",
        "No module named 'driver_side_envs'",
        "every node needs it, installed there or on the PYTHONPATH its `ray start` was given",
    )


def start_long_run(tmp_path) -> subprocess.Popen:
    """A RayBeast run that would train for long, in its own process group (as under a
    terminal or a job scheduler), its output captured."""
    return subprocess.Popen(
        raybeast_command(tmp_path, *SMALL_RUN, "--total_steps", "10000000", "--xpid", "run"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.mark.parametrize(
    "signum, logged",
    [(signal.SIGINT, "Interrupted"), (signal.SIGTERM, "Stopped at step")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_to_the_process_group_saves_a_checkpoint_and_stops_ray(tmp_path, signum, logged):
    # As from a terminal (Ctrl-C) or a job scheduler (SIGTERM): the signal reaches the run
    # and every process of its group, the local Ray's daemons too.
    before = set(ray_daemon_pids())  # the test cluster's, if it is up
    process = start_long_run(tmp_path)
    try:
        wait_for_rows(tmp_path / "run" / "logs.csv", 3)
    finally:
        os.killpg(process.pid, signum)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, output  # unfinished: a scheduler restarts it
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert logged in out_log and "died" not in out_log
    assert (tmp_path / "run" / "model.tar").exists()
    wait_for(
        lambda: not rollout_actor_pids() and set(ray_daemon_pids()) <= before, 30, "Ray to stop"
    )


def test_riverraid_proxy_statistics_and_eval_mode(tmp_path, ray_cluster):
    run = ["--env", "RiverraidNoFrameskip-v4", "--hidden_size", "64", "--fuel_multiplier", "0"]
    # 2 envs per actor (not 4): each plays 2,000 steps, long enough for a random game of
    # Riverraid to end (with 4 envs of 1,250 steps each, none sometimes did).
    trained = raybeast(
        tmp_path, *SMALL_RUN[2:], "--envs_per_actor", "2", *run, "--ray_address", ray_cluster,
        "--total_steps", "8000", "--xpid", "run",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert_fuel_proxy_logged(tmp_path / "run", fuel_multiplier=0)
    steer_right(tmp_path / "run" / "model.tar")  # greedy games that end quickly
    evaluated = raybeast(tmp_path, *run, "--mode", "eval", "--xpid", "run", "--num_episodes", "1")
    assert evaluated.returncode == 0, evaluated.stderr
    assert (tmp_path / "run" / "eval.json").exists()


def test_sigterm_while_ray_starts_stops_the_run_and_its_ray_instance(tmp_path):
    # A scheduler may take the machine back while the run is still starting Ray.
    before = set(ray_daemon_pids())  # the test cluster's, if it is up
    process = start_long_run(tmp_path)
    try:
        wait_for(lambda: set(ray_daemon_pids()) - before, 60, "Ray's daemons to start")
    finally:
        process.send_signal(signal.SIGTERM)  # to the run alone, as `kill PID` sends it
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, output
    assert output.strip().splitlines()[-1].startswith("stopped by SIGTERM"), output
    assert "Traceback" not in output
    wait_for(lambda: set(ray_daemon_pids()) <= before, 30, "Ray to stop")


def ray_agent_pids() -> list[int]:
    """The agents a raylet starts beside it (dashboard agent, runtime env agent)."""
    return pids_whose("cmdline", lambda cmdline: re.match(r"ray::\w*Agent", cmdline) is not None)


def test_ctrl_c_while_ray_starts_leaves_no_ray_process_behind(tmp_path):
    # Ctrl-C after the raylet started its agents, before the driver has connected: Ray's
    # own stop knew nothing of them, and they ran on for a minute with no raylet.
    before_daemons, before_agents = set(ray_daemon_pids()), set(ray_agent_pids())
    process = start_long_run(tmp_path)
    try:
        wait_for(lambda: set(ray_agent_pids()) - before_agents, 60, "Ray's agents to start")
    finally:
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT, output
    assert output.strip().splitlines()[-1] == "interrupted", output
    assert "Traceback" not in output
    wait_for(
        lambda: set(ray_daemon_pids()) <= before_daemons and set(ray_agent_pids()) <= before_agents,
        20,
        "Ray's daemons and agents to stop",
    )


# RayBeast as its command runs, on a cluster that had 3 CPUs when it started and has 2 now
# (as after a lost node), and a start deadline of 5 s.
LOST_CPU = """
import sys
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_ray_parser
from torchbeast.config.settings import build_settings
from torchbeast.runtime.ray.prepare import prepare_environment
prepare_environment(build_settings(parse_flags(sys.argv[1:], make_ray_parser()), "ray"))
import ray
ray.cluster_resources = lambda: {"CPU": 3.0}  # what the actors' shares are taken from
ray.available_resources = lambda: {"CPU": 3.0}
from torchbeast.runtime.ray import actor_pool
actor_pool.START_DEADLINE_S = 5.0
from torchbeast.raybeast import main
sys.exit(main(sys.argv[1:]))
"""


HUNG_ACTOR = LOST_CPU.replace(
    'ray.cluster_resources = lambda: {"CPU": 3.0}  # what the actors\' shares are taken from\n'
    'ray.available_resources = lambda: {"CPU": 3.0}\n',
    "",
).replace("actor_pool.START_DEADLINE_S = 5.0", "actor_pool.HUNG_DEADLINE_S = 5.0")


def test_a_hung_actor_is_replaced_and_training_goes_on(tmp_path, ray_cluster):
    # An env stuck in its step: the run waited for its actor's rollouts for ever, without
    # a word (the other actor held back, at 0 SPS).
    from tests.envs_for_tests import HANG_ONCE_MARKER

    if os.path.exists(HANG_ONCE_MARKER):
        os.unlink(HANG_ONCE_MARKER)
    flags = [*SMALL_RUN, "--env", "tests.envs_for_tests:HangingOnce-v0"]
    flags += ["--batch_size", "8"]  # each batch takes both actors' envs, the hung one's too
    flags += ["--ray_address", ray_cluster, "--total_steps", "4000"]
    flags += ["--savedir", str(tmp_path), "--xpid", "run"]
    try:
        result = subprocess.run(
            [sys.executable, "-c", HUNG_ACTOR, *flags],
            cwd=REPO, capture_output=True, text=True, timeout=240, env=os.environ | LOOPBACK,
        )  # fmt: skip
    finally:
        hung = os.path.exists(HANG_ONCE_MARKER)
        if hung:
            os.unlink(HANG_ONCE_MARKER)
    assert hung, "no env hung"
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert re.search(
        r"Actor [01] died \(no rollout 5 s after it was asked for one: is an env stuck in its "
        r"step\?\); starting a new one\.",
        output,
    ), output
    assert int(read_rows(tmp_path / "run" / "logs.csv")[-1]["step"]) >= 4000


def test_an_actor_the_cluster_cannot_place_stops_the_run_with_one_line(tmp_path, ray_cluster):
    # Each of 3 actors asks for 1 CPU of the 2 there are: one never starts, and the
    # run, which would wait for it without a word, stops saying why, its checkpoint saved.
    flags = [*SMALL_RUN, "--num_actors", "3", "--ray_address", ray_cluster]
    flags += ["--total_steps", "100000000", "--savedir", str(tmp_path), "--xpid", "run"]
    result = subprocess.run(
        [sys.executable, "-c", LOST_CPU, *flags],
        cwd=REPO, capture_output=True, text=True, timeout=240, env=os.environ | LOOPBACK,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    # Whichever of the three Ray placed last is the one left without a CPU.
    assert re.match(
        r"error: actor [012] has not started in 5 s: the cluster has no room for the 1 CPUs "
        r"it asks for \(did a node go down, or other work take them\?\); run it again \(with "
        r"this run's --xpid\) to go on with the CPUs free then",
        result.stderr.strip().splitlines()[-1],
    ), result.stderr
    assert (tmp_path / "run" / "model.tar").exists()


# Another job on the cluster: an actor that holds a number of its CPUs until its stdin
# closes.
HOLD_CPUS = """
import sys
from torchbeast.runtime.ray.prepare import prepare_ray_environment
prepare_ray_environment(sys.argv[1])
import ray
ray.init(address=sys.argv[1], logging_level="WARNING")
@ray.remote(num_cpus=float(sys.argv[2]))
class Holder:
    def ready(self):
        return True
holder = Holder.remote()
ray.get(holder.ready.remote())
print("holding", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def cpus_held(ray_cluster: str, cpus: float) -> Iterator[None]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_CPUS, ray_cluster, str(cpus)],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=os.environ | LOOPBACK,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "holding\n"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_a_cluster_whose_cpus_other_work_holds_is_one_line_at_once(tmp_path, ray_cluster):
    # The actors asked for shares of all the CPUs, could not be placed, and the run said
    # "did a node go down?" after five minutes.
    with cpus_held(ray_cluster, 2):
        result = raybeast(tmp_path, *SMALL_RUN, "--ray_address", ray_cluster, timeout=120)
    assert_one_error_line(
        result,
        "the Ray cluster has no CPU free for the actors: other work holds all 2 of its CPUs",
    )


def test_more_actors_than_ray_can_place_is_one_line(tmp_path, ray_cluster):
    # Ray places at least 0.0001 CPUs an actor: 2 CPUs take 20000 actors.
    result = raybeast(
        tmp_path, *SMALL_RUN, "--num_actors", "30000", "--envs_per_actor", "1",
        "--ray_address", ray_cluster, "--xpid", "run",
    )  # fmt: skip
    assert_one_error_line(
        result,
        "30000 actors are too many for the 2 CPUs free on the Ray cluster",
        "give at most 20000 --num_actors, with more --envs_per_actor each",
    )
    # Its meta.json said it had not ended (date_end null), as a crashed run's does.
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["date_end"] is not None and meta["successful"] is False


def test_a_cluster_without_cpus_is_told_apart_from_one_whose_cpus_are_taken(monkeypatch):
    # A head started with --num-cpus 0 and no other node: what Ray would report of it.
    import ray

    from torchbeast.runtime.ray import actor_pool
    from torchbeast.runtime.training import TrainingError

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"memory": 1e9})
    monkeypatch.setattr(ray, "available_resources", lambda: {"memory": 1e9})
    with pytest.raises(TrainingError, match=r"has no CPUs for the actors \(a head started"):
        actor_pool.cpus_per_actor(2)


def test_actors_share_the_cpus_other_work_leaves_free(tmp_path, ray_cluster):
    with cpus_held(ray_cluster, 1.5):
        result = raybeast(
            tmp_path, *SMALL_RUN, "--ray_address", ray_cluster, "--total_steps", "500",
            "--xpid", "run",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out_log = (tmp_path / "run" / "out.log").read_text()
    assert "Other work holds 1.5 of the Ray cluster's 2 CPUs: the 2 actors share the 0.5 free" in (
        out_log
    )


# The (actor, env) sources of a real RayBeast pool's first batches, one JSON line each.
RAY_BATCHES = """
import json, sys
from torchbeast.config.flags import parse_flags
from torchbeast.config.parsers import make_ray_parser
from torchbeast.config.settings import build_settings
from torchbeast.runtime.ray.prepare import prepare_environment
settings = build_settings(parse_flags(sys.argv[2:], make_ray_parser()), "ray")
prepare_environment(settings)  # before Ray is imported
from torchbeast.runtime.ray import trainer
with trainer.session(settings) as ray_trainer:
    pool = ray_trainer.create_pool()
    pool.start()
    try:
        for _ in range(int(sys.argv[1])):
            got = pool.get_batch()
            assert got is not None, pool.error
            print(json.dumps(got[2]), flush=True)
    finally:
        pool.stop()
"""


def ray_batches(tmp_path, ray_cluster, count: int, *flags: str) -> list[list[tuple]]:
    """The sorted (actor, env) sources of a real RayBeast pool's first ``count`` batches."""
    argv = [
        *SLOW_SECOND_ACTOR, *flags, "--ray_address", ray_cluster,
        "--savedir", str(tmp_path), "--disable_checkpoint",
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", RAY_BATCHES, str(count), *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [sorted(map(tuple, json.loads(line))) for line in done.stdout.splitlines()]


def test_a_ray_actor_that_runs_ahead_does_not_fill_a_batch_alone(tmp_path, ray_cluster):
    # Actor 1's steps take 20 ms, actor 0's none: in arrival order alone, actor 0 would
    # deliver several rollouts for each of actor 1's, and fill batches alone.
    batches = ray_batches(tmp_path, ray_cluster, 24, "--batch_size", "4")
    assert len(batches) == 24
    # While actor 1 starts, actor 0's rollouts are all there is.
    first_with_both = next(i for i, sources in enumerate(batches) if (1, 0) in sources)
    later = batches[first_with_both:]
    assert len(later) >= 12
    assert all(sources == [(0, 0), (0, 1), (1, 0), (1, 1)] for sources in later), later


def test_with_fewer_ray_envs_than_the_batch_batches_keep_coming(tmp_path, ray_cluster):
    # 3 envs (the third slow), B = 7: each env at most three times per batch, more than
    # an actor's two tasks in flight deliver; actors are held back while ahead, and when
    # every actor is held back, what waits must still fill a batch.
    flags = ["--num_actors", "3", "--envs_per_actor", "1", "--batch_size", "7"]
    batches = ray_batches(tmp_path, ray_cluster, 12, *flags)
    assert len(batches) == 12 and all(len(sources) == 7 for sources in batches)
