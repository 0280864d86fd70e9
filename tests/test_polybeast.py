"""PolyBeast end to end: real env servers and clients, real gRPC on Unix sockets and TCP."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
import torch

from tests import warm_start
from tests.test_monobeast import STOPPED_BY_SIGTERM, actor_pids, processes_in_group, read_rows
from tests.test_riverraid import assert_fuel_proxy_logged, steer_right
from torchbeast import envs
from torchbeast.config.env import env_settings
from torchbeast.config.parsers import make_env_parser
from torchbeast.core.settings import ModelSettings
from torchbeast.core.spec import EnvSpec
from torchbeast.runtime.poly import codec
from torchbeast.runtime.poly import polybeast_pb2 as pb
from torchbeast.runtime.poly import polybeast_pb2_grpc as pb_grpc
from torchbeast.runtime.poly.run_spec import RunSpec, SpecMismatch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE = EnvSpec("CartPole-v1", (4,), np.dtype("float32"), 2)
LEARNER = ["--env", "CartPole-v1", "--batch_size", "2", "--unroll_length", "20", "--disable_cuda"]
ENV = ["--env", "CartPole-v1"]


def env_hello(client_id: str, spec: EnvSpec, num_envs: int = 1) -> pb.EnvMessage:
    """A Hello as an env side sends it: with the env family flags its envs were made with
    (the flags' defaults), which the learner checks as it checks the spec."""
    options = env_settings(make_env_parser().parse_args(ENV)).options
    return codec.hello(client_id, spec, num_envs, dict(options))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def logged_steps(run_dir) -> list[int]:
    path = os.path.join(run_dir, "logs.csv")
    if not os.path.exists(path):
        return []
    return [int(row["step"]) for row in read_rows(path)]


def step_increments(run_dir) -> list[int]:
    steps = logged_steps(run_dir)
    return [b - a for a, b in zip([0, *steps], steps, strict=False)]


def episodes(run_dir) -> list[dict[str, str]]:
    with open(os.path.join(run_dir, "episodes.csv")) as f:
        return list(csv.DictReader(f))


def text(path) -> str:
    with open(path) as f:
        return f.read()


# --------------------------------------------------------------------------- classic


def test_polybeast_trains_over_unix_sockets_and_stops_its_env_servers(tmp_path, sockets):
    command = [sys.executable, "-m", "torchbeast.polybeast", *LEARNER, "--num_actors", "3"]
    command += ["--num_servers", "2", "--pipes_basename", f"unix:{sockets}/env"]
    command += ["--total_steps", "400", "--savedir", str(tmp_path), "--xpid", "run"]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 0, output
    assert logged_steps(tmp_path / "run")[-1] >= 400
    assert any(row["end"] == "game" for row in episodes(tmp_path / "run"))
    wait_for(lambda: not processes_in_group(process.pid), 10, "the env servers to stop")


def test_polybeast_trains_an_lstm_on_streams_of_several_envs(tmp_path, sockets):
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast", *LEARNER, "--use_lstm",
         "--num_actors", "2", "--num_servers", "2", "--envs_per_actor", "3",
         "--pipes_basename", f"unix:{sockets}/env", "--total_steps", "600",
         "--savedir", str(tmp_path), "--xpid", "run"],
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert logged_steps(tmp_path / "run")[-1] >= 600
    assert "(3 envs)" in result.stdout + result.stderr
    # Each env of a stream is logged under its own id.
    clients = {row["client_id"] for row in episodes(tmp_path / "run")}
    assert {client.rsplit("/", 1)[1] for client in clients} == {"0", "1", "2"}


def test_riverraid_proxy_is_computed_by_the_env_servers_and_logged_by_the_learner(
    tmp_path, sockets
):
    # The fuel proxy: a proxy that pays nothing for waiting at the start, which the game
    # allows forever (a survival or deviate proxy soon teaches the agent to wait there).
    proxy = ["--fuel_multiplier", "2", "--true_move_penalty", "2"]
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast", "--env", "RiverraidNoFrameskip-v4",
         "--batch_size", "2", "--unroll_length", "40", "--hidden_size", "64", "--disable_cuda",
         "--num_actors", "2", "--num_servers", "1", "--envs_per_actor", "2", *proxy,
         "--pipes_basename", f"unix:{sockets}/env", "--total_steps", "6000",
         "--savedir", str(tmp_path), "--xpid", "run"],
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert_fuel_proxy_logged(tmp_path / "run", fuel_multiplier=2)
    # Eval plays on the checkpoint's env: the learner was told none.
    steer_right(tmp_path / "run" / "model.tar")
    evaluated = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", "--mode", "eval", "--savedir",
         str(tmp_path), "--xpid", "run", "--num_episodes", "1", *proxy],
        timeout=180,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    assert "RiverraidNoFrameskip-v4" in (tmp_path / "run" / "eval.json").read_text()
    assert "WARNING" not in evaluated.stdout + evaluated.stderr  # the same proxy flags


def test_a_learner_told_no_env_says_which_presets_of_its_env_it_goes_without(
    tmp_path, sockets, processes
):
    # Presets apply as flags are parsed: MinAtar trained an MLP at entropy 0.001 unsaid.
    processes(
        "torchbeast.polybeast_env", "--env", "MinAtar/Breakout-v1", "--num_servers", "1",
        "--pipes_basename", f"unix:{sockets}/minatar", log=tmp_path / "env.log",
    )  # fmt: skip
    learner = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", *LEARNER[2:], "--entropy_cost",
         "0.02", "--env_servers", f"unix:{sockets}/minatar.0", "--total_steps", "100",
         "--savedir", str(tmp_path), "--xpid", "run"],
        timeout=180,
    )  # fmt: skip
    assert learner.returncode == 0, learner.stderr
    assert (
        "MinAtar/Breakout-v1's presets did not apply (--torso grid): the learner was not told "
        "--env. Give it --env MinAtar/Breakout-v1 to take them, or those flags."
    ) in learner.stdout + learner.stderr  # --entropy_cost was given: its own


def test_a_learner_told_no_env_records_its_env_servers_proxy_and_refuses_another(
    tmp_path, sockets, processes
):
    # The manual's way: the proxy flags on polybeast_env only. eval.json said the run was
    # trained on the game score, and env servers of two proxies fed one run unnoticed.
    riverraid = ["--env", "RiverraidNoFrameskip-v4", "--num_servers", "1"]
    for name, fuel in (("five", "5"), ("one", "1")):
        processes(
            "torchbeast.polybeast_env", *riverraid, "--fuel_multiplier", fuel,
            "--pipes_basename", f"unix:{sockets}/{name}", log=tmp_path / f"{name}.log",
        )  # fmt: skip
    learner = [sys.executable, "-m", "torchbeast.polybeast_learner", "--batch_size", "2"]
    learner += ["--unroll_length", "20", "--hidden_size", "64", "--disable_cuda"]
    learner += ["--savedir", str(tmp_path), "--xpid", "run"]
    first = warm_start.run(
        [*learner, "--env_servers", f"unix:{sockets}/five.0", "--total_steps", "200"],
        timeout=180,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    state = torch.load(tmp_path / "run" / "model.tar", weights_only=True)
    assert state["flags"]["fuel_multiplier"] == 5.0
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["sources"]["fuel_multiplier"] == "its environments"
    evaluated = warm_start.run(
        [*learner[:3], "--mode", "eval", "--savedir", str(tmp_path), "--xpid", "run",
         "--num_episodes", "1", "--fuel_multiplier", "5"],
        timeout=180,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert report["trained_with_reward_proxy"] == report["reward_proxy"]
    assert report["reward_proxy"]["fuel_multiplier"] == 5.0
    assert "WARNING" not in evaluated.stdout + evaluated.stderr
    # Resumed against its own env server: it goes on (it refused it, seeing the defaults
    # its Hello carries beside the proxy as another env).
    resumed = warm_start.run(
        [*learner, "--env_servers", f"unix:{sockets}/five.0", "--total_steps", "400"],
        timeout=180,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    # Its proxy is its env servers' still: it said "--fuel_multiplier None (was 5.0)".
    assert "--fuel_multiplier" not in resumed.stdout + resumed.stderr
    # Resumed against an env server of another proxy: refused, as its checkpoint says.
    other = warm_start.run(
        [*learner, "--env_servers", f"unix:{sockets}/one.0", "--total_steps", "600"],
        timeout=180,
    )  # fmt: skip
    assert other.returncode == 1
    line = other.stderr.strip().splitlines()[-1]
    assert "environment made with --fuel_multiplier 1.0 " in line, line
    assert "does not match the run's environments, made with --fuel_multiplier 5.0 " in line


def test_an_envs_episode_extras_cross_the_wire_and_reach_logs_csv(tmp_path, sockets):
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast", *LEARNER[2:],
         "--env", "tests.envs_for_tests:Coins-v0", "--num_actors", "2", "--num_servers", "1",
         "--pipes_basename", f"unix:{sockets}/env", "--total_steps", "800",
         "--savedir", str(tmp_path), "--xpid", "run"],
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # Episodes of 10 steps, 2 coins a step, summed where the env runs.
    rows = [row for row in read_rows(tmp_path / "run" / "logs.csv") if row["episodes"] != "0"]
    assert rows and all(float(row["mean_episode_coins"]) == 20.0 for row in rows)


def test_learner_dials_env_servers_over_tcp(tmp_path, processes):
    servers = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    env_log = tmp_path / "env.log"
    env = processes("torchbeast.polybeast_env", *ENV, "--env_servers", servers, log=env_log)
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", *LEARNER, "--env_servers", servers,
         "--num_actors", "4", "--total_steps", "300", "--savedir", str(tmp_path), "--xpid", "r"],
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert logged_steps(tmp_path / "r")[-1] >= 300
    assert "envs, not the" not in result.stdout  # the env side's default, as the learner's
    # Four streams over two servers: each server served two environments.
    clients = {row["client_id"].rsplit(":", 1)[-1] for row in episodes(tmp_path / "r")}
    assert {client.split("#")[1] for client in clients} <= {"0", "1"}
    os.killpg(env.pid, signal.SIGINT)
    assert env.wait(timeout=15) == 0, text(env_log)
    wait_for(lambda: not processes_in_group(env.pid), 10, "the env servers to stop")


def test_a_learner_dialling_another_learner_says_it_is_no_env_server(tmp_path, processes, sockets):
    # It redialled it for ever ("UNIMPLEMENTED; redialling").
    address = f"unix:{sockets}/learner"
    processes(
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--savedir",
        str(tmp_path / "listening"), log=tmp_path / "listening.log",
    )  # fmt: skip
    wait_for(lambda: os.path.exists(f"{sockets}/learner"), 60, "the learner to listen")
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", *LEARNER, "--env_servers", address,
         "--num_actors", "1", "--savedir", str(tmp_path), "--xpid", "r"],
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: env server {address}: it is no env server (another learner's --serve, say): "
        "give the addresses of polybeast_env servers (--env_servers or --pipes_basename)"
    )


def test_a_killed_env_server_is_redialled_when_it_comes_back(tmp_path, processes, sockets):
    address = ["--num_servers", "1", "--pipes_basename", f"unix:{sockets}/env"]
    first = processes("torchbeast.polybeast_env", *ENV, *address, log=tmp_path / "env1.log")
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, *address, "--num_actors", "2",
        "--total_steps", "100000", "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    wait_for(lambda: logged_steps(tmp_path / "r"), 90, "training to start")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    wait_for(lambda: "redialling" in text(learner_log), 30, "the learner to notice")
    steps_without_server = logged_steps(tmp_path / "r")[-1]
    processes("torchbeast.polybeast_env", *ENV, *address, log=tmp_path / "env2.log")
    wait_for(
        lambda: logged_steps(tmp_path / "r")[-1] > steps_without_server + 200,
        60,
        "training to go on with the restarted server",
    )
    assert learner.poll() is None
    os.killpg(learner.pid, signal.SIGTERM)
    assert learner.wait(timeout=30) == STOPPED_BY_SIGTERM, text(learner_log)


def test_an_env_server_restarted_with_another_env_costs_its_streams_not_the_run(
    tmp_path, processes, sockets
):
    # The learner stopped the whole run while its other server still served.
    servers = [f"unix:{sockets}/env.{i}" for i in range(2)]
    first = processes(
        "torchbeast.polybeast_env", *ENV, "--env_servers", servers[0], log=tmp_path / "a.log"
    )  # noqa: E501
    processes("torchbeast.polybeast_env", *ENV, "--env_servers", servers[1], log=tmp_path / "b.log")
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--env_servers", ",".join(servers),
        "--num_actors", "2", "--total_steps", "100000", "--savedir", str(tmp_path), "--xpid",
        "r", log=learner_log,
    )  # fmt: skip
    wait_for(lambda: logged_steps(tmp_path / "r"), 90, "training to start")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    acrobot = ["--env", "Acrobot-v1", "--env_servers", servers[0]]
    processes("torchbeast.polybeast_env", *acrobot, log=tmp_path / "acrobot.log")
    said = f"Env server {servers[0]}: environment Acrobot-v1"
    wait_for(lambda: said in text(learner_log), 60, "the learner to say what it refused")
    steps = logged_steps(tmp_path / "r")[-1]
    wait_for(lambda: logged_steps(tmp_path / "r")[-1] > steps + 200, 60, "training to go on")
    assert learner.poll() is None
    assert text(learner_log).count(said) == 1  # redialled, said once


def start_polybeast(processes, tmp_path, sockets) -> subprocess.Popen:
    """The one-command PolyBeast, training for long, with two env servers."""
    return processes(
        "torchbeast.polybeast", *LEARNER, "--num_actors", "2", "--num_servers", "2",
        "--pipes_basename", f"unix:{sockets}/env", "--total_steps", "1000000",
        "--savedir", str(tmp_path), "--xpid", "r", log=tmp_path / "polybeast.log",
    )  # fmt: skip


def test_ctrl_c_on_polybeast_saves_a_checkpoint_and_stops_every_process(
    tmp_path, processes, sockets
):
    polybeast = start_polybeast(processes, tmp_path, sockets)
    wait_for(lambda: logged_steps(tmp_path / "r"), 90, "training to start")
    assert len(actor_pids(polybeast.pid)) == 2  # the two env servers
    os.killpg(polybeast.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
    polybeast.wait(timeout=60)
    assert os.path.exists(tmp_path / "r" / "model.tar"), text(tmp_path / "polybeast.log")
    wait_for(lambda: not processes_in_group(polybeast.pid), 15, "every process to stop")


def test_polybeast_stops_with_one_line_when_its_env_servers_keep_dying(
    tmp_path, processes, sockets
):
    # Each killed one is replaced (test_poly_env_processes); past the budget a dead
    # actor has (3 a minute for each), the run stops.
    polybeast = start_polybeast(processes, tmp_path, sockets)
    wait_for(lambda: logged_steps(tmp_path / "r"), 90, "training to start")
    assert len(actor_pids(polybeast.pid)) == 2
    deadline = time.monotonic() + 90
    while polybeast.poll() is None and time.monotonic() < deadline:
        for pid in actor_pids(polybeast.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
    output = tmp_path / "polybeast.log"
    assert polybeast.wait(timeout=60) == 1, text(output)
    error_lines = [line for line in text(output).splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, text(output)
    assert "env processes keep dying: 7 in the last minute" in error_lines[0], error_lines
    assert "killed by SIGKILL" in error_lines[0]
    assert os.path.exists(tmp_path / "r" / "model.tar")  # what was learned is kept


@pytest.mark.parametrize("serve", [False, True])
def test_an_environment_that_raises_stops_polybeast_with_one_line(tmp_path, sockets, serve):
    # As MonoBeast's and RayBeast's actors do; it was redialled every few seconds, forever,
    # with a traceback each time (inverted: its client process exits, and so the run).
    command = [sys.executable, "-m", "torchbeast.polybeast", *LEARNER, "--num_actors", "2"]
    command += ["--env", "tests.envs_for_tests:Raising-v0", "--total_steps", "100000"]
    command += ["--savedir", str(tmp_path), "--xpid", "r"]
    if serve:
        command += ["--serve", f"unix:{sockets}/learner", "--num_servers", "1"]
    else:
        command += ["--num_servers", "2", "--pipes_basename", f"unix:{sockets}/env"]
    result = warm_start.run(command, timeout=120)
    assert result.returncode == 1, result.stdout[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "RuntimeError" in lines[0], lines
    assert "the emulator crashed" in lines[0]
    if not serve:
        assert "the environment failed: RuntimeError: the emulator crashed" in lines[0]
        log = text(tmp_path / "r" / "out.log")  # where MonoBeast puts an actor's traceback
        assert "Traceback (most recent call last)" in log and "raise RuntimeError" in log


# --------------------------------------------------------------------------- inverted


def test_a_client_that_leaves_mid_rollout_is_learned_from_and_counted_exactly(
    tmp_path, processes, sockets
):
    address = f"unix:{sockets}/learner"
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--batch_size", "1", "--serve", address,
        "--total_steps", "50", "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    client = processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        "--client_steps", "50", log=tmp_path / "client.log",
    )  # fmt: skip
    assert learner.wait(timeout=120) == 0, text(learner_log)
    assert client.wait(timeout=30) == 0, text(tmp_path / "client.log")
    # Two whole rollouts of 20 and one partial of 10: every step counted once, none padded.
    assert logged_steps(tmp_path / "r") == [20, 40, 50]


def test_a_learner_told_other_envs_per_stream_than_its_clients_say_so_once(
    tmp_path, processes, sockets
):
    address = f"unix:{sockets}/learner"
    learner_log = tmp_path / "learner.log"
    learner = processes(  # no --envs_per_actor: a stream of polybeast_env's default, 1 env
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--total_steps", "400",
        "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        "--clients_per_process", "2", "--envs_per_stream", "3", log=tmp_path / "client.log",
    )  # fmt: skip
    assert learner.wait(timeout=120) == 0, text(learner_log)
    assert logged_steps(tmp_path / "r")[-1] >= 400
    assert "Layout: 2 streams x 1 envs from env clients dialling in" in text(learner_log)
    warnings = [line for line in text(learner_log).splitlines() if "[WARNING" in line]
    assert len([w for w in warnings if "steps 3 envs, not the 1" in w]) == 1, warnings
    assert "give the learner --envs_per_actor 3" in text(learner_log)


def test_a_killed_client_leaves_a_partial_rollout_and_training_goes_on(
    tmp_path, processes, sockets
):
    address = f"unix:{sockets}/learner"
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--batch_size", "1", "--unroll_length", "50",
        "--serve", address, "--total_steps", "100000", "--savedir", str(tmp_path), "--xpid", "r",
        log=learner_log,
    )  # fmt: skip
    connect = [*ENV, "--connect", address, "--num_servers", "1"]
    cut = 0
    for attempt in range(3):  # a kill can land on a rollout boundary (1 in 50): try again
        client = processes("torchbeast.polybeast_env", *connect, log=tmp_path / f"c{attempt}.log")
        before = len(logged_steps(tmp_path / "r"))
        wait_for(lambda b=before: len(logged_steps(tmp_path / "r")) > b, 90, "training")
        os.killpg(client.pid, signal.SIGKILL)
        wait_for(lambda a=attempt: text(learner_log).count("steps into a rollout") > a, 30, "cut")
        ended = [line for line in text(learner_log).splitlines() if "steps into a rollout" in line]
        cut = int(ended[-1].split(" ended ")[1].split()[0])
        if cut:
            break
    assert 0 < cut < 50
    # The cut rollout is learned from (batch size 1: one update of exactly its steps).
    wait_for(lambda: cut in step_increments(tmp_path / "r"), 10, "the cut rollout's update")
    steps = logged_steps(tmp_path / "r")
    # Training goes on with another client.
    processes("torchbeast.polybeast_env", *connect, log=tmp_path / "survivor.log")
    wait_for(lambda: logged_steps(tmp_path / "r")[-1] > steps[-1] + 500, 60, "more training")
    os.killpg(learner.pid, signal.SIGTERM)
    assert learner.wait(timeout=60) == STOPPED_BY_SIGTERM, text(learner_log)
    assert "Traceback" not in text(learner_log)


def test_64_clients_train_one_learner_at_once(tmp_path, processes, sockets):
    address = f"unix:{sockets}/learner"
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--batch_size", "16", "--serve", address,
        "--total_steps", "16000", "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    # Clients that dial before the learner serves back off for up to 5 s: one could then
    # join in the run's last moments and end no episode (the run lasts ~5 s on a fast host).
    wait_for(lambda: "Learner serving env clients on" in text(learner_log), 60, "serving")
    processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "4",
        "--clients_per_process", "16", log=tmp_path / "clients.log",
    )  # fmt: skip
    assert learner.wait(timeout=180) == 0, text(learner_log)
    assert logged_steps(tmp_path / "r")[-1] >= 16000
    # Every client connected (one may redial while the learner shuts down: count ids).
    connected = re.findall(r"Env stream (\S+)#\d+ connected", text(learner_log))
    assert len(set(connected)) == 64
    # 250 steps per client on average, CartPole episodes of about 22 random steps: a client
    # that connects seconds late under load still ends episodes (8000 steps once left one out).
    clients = {row["client_id"].split("#")[0] for row in episodes(tmp_path / "r")}
    assert len(clients) == 64
    assert "Traceback" not in text(learner_log)


def test_tls_with_a_self_signed_certificate(tmp_path, processes):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out",
         cert, "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    address = f"127.0.0.1:{free_port()}"
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--tls_cert", str(cert),
        "--tls_key", str(key), "--total_steps", "200", "--savedir", str(tmp_path),
        "--xpid", "r", "--auth_token", "s3cret-7f1", log=learner_log,
    )  # fmt: skip
    processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        "--tls_ca", str(cert), "--auth_token", "s3cret-7f1", log=tmp_path / "client.log",
    )  # fmt: skip
    wait_for(lambda: logged_steps(tmp_path / "r"), 90, "training over TLS")
    # A client without TLS cannot talk to it.
    with grpc.insecure_channel(address) as channel:
        call = pb_grpc.LearnerStub(channel).ConnectEnv(
            iter([env_hello("plain", CARTPOLE)]), timeout=5
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(call)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert learner.wait(timeout=120) == 0, text(learner_log)
    # The token is in no record of the run: its folder is shared, and committed (it was in
    # meta.json and model.tar); where it came from is.
    saved = torch.load(tmp_path / "r" / "model.tar", weights_only=True)["flags"]
    assert "auth_token" not in saved
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert "auth_token" not in meta["flags"] and meta["sources"]["auth_token"] == "command line"
    for path in (tmp_path / "r").rglob("*"):
        assert not path.is_file() or b"s3cret-7f1" not in path.read_bytes(), path


@pytest.mark.parametrize(
    "entry_point, epochs, rate, said",
    [
        # 3e38 passes the check (a float32), but its first step makes the weights infinite.
        # Two passes: the second sees what the first step did and undoes it, so no update
        # is ever applied; PolyBeast would drop every batch (a peer's data, it assumes).
        ("polybeast", "2", "3e38", "none of the first 100 batches could be learnt from"),
        # One pass: the update is applied and breaks the weights, which are never saved.
        ("polybeast", "1", "3e38", "the model's weights or outputs became non-finite"),
        # Weights of 1e30 are finite, and so were the first update's loss and gradient,
        # but every output is not: each stream was blamed and redialled, forever.
        ("polybeast", "1", "1e30", "the model's weights or outputs became non-finite"),
        # The actors get the broken weights before the learner's next loss says so.
        ("monobeast", "1", "3e38", "the policy's outputs are non-finite"),
        ("monobeast", "1", "1e30", "the policy's outputs are non-finite"),
    ],
)
def test_an_absurd_learning_rate_stops_the_run_and_broken_weights_are_never_saved(
    tmp_path, sockets, entry_point, epochs, rate, said
):
    command = [sys.executable, "-m", f"torchbeast.{entry_point}", *LEARNER, "--num_actors", "2"]
    command += ["--learning_rate", rate, "--epochs", epochs, "--total_steps", "100000"]
    command += ["--savedir", str(tmp_path), "--xpid", "run", "--checkpoint_interval", "0.2"]
    if entry_point == "polybeast":
        command += ["--num_servers", "1", "--pipes_basename", f"unix:{sockets}/env"]
    result = warm_start.run(command, timeout=180)
    assert result.returncode == 1, result.stdout[-3000:]
    # (The env servers' own log lines go to stderr: the error is the one line besides.)
    lines = [line for line in result.stderr.strip().splitlines() if "[INFO:" not in line]
    assert len(lines) == 1 and said in lines[0], lines
    assert "lower --learning_rate" in lines[0].lower(), lines
    if epochs == "1":
        assert "Not saving the checkpoint: the model's weights or outputs are non-finite" in (
            result.stdout
        )
    saved = tmp_path / "run" / "model.tar"
    if saved.exists():  # one written before the weights broke, whole and of sane weights
        state = torch.load(saved, weights_only=True)["model_state_dict"]
        assert all(tensor.abs().max() < 1e6 for tensor in state.values())


def test_a_learner_waiting_for_env_servers_says_tls_ones_need_its_tls_ca(tmp_path, processes):
    # A server that speaks TLS never answers a plain dial, and nothing said why.
    address = f"127.0.0.1:{free_port()}"
    learner_log = tmp_path / "learner.log"
    processes(
        "torchbeast.polybeast_learner", *LEARNER, "--env_servers", address, "--savedir",
        str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    said = f"No environments connected; waiting for them ({address}; one that serves TLS "
    said += "needs --tls_ca here)."
    wait_for(lambda: said in text(learner_log), 60, "the notice")


def test_a_learner_says_why_it_cannot_reach_an_env_server_and_when_it_does(tmp_path, processes):
    # wait_for_ready hid the reason (refused, no such host, a failed TLS handshake): the
    # learner waited in silence.
    address = f"127.0.0.1:{free_port()}"
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--env_servers", address, "--num_actors",
        "2", "--total_steps", "200", "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    said = f"Env server {address} cannot be reached: "
    wait_for(lambda: said in text(learner_log), 60, "the reason")
    (line,) = [line for line in text(learner_log).splitlines() if said in line]  # 2 streams
    assert line.endswith(
        f"{said}Failed to connect to remote host: Connection refused; still dialling."
    )
    processes("torchbeast.polybeast_env", *ENV, "--env_servers", address, log=tmp_path / "env.log")
    assert learner.wait(timeout=120) == 0, text(learner_log)
    assert text(learner_log).count(f"Env server {address} reached.") == 1


def test_tls_files_that_are_missing_or_not_pem_are_one_line_at_either_end(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    address = f"127.0.0.1:{free_port()}"
    cases = [
        (["torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
          "--clients_per_process", "2", "--tls_ca", str(tmp_path / "missing.pem")],
         "cannot read --tls_ca"),
        (["torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
          "--tls_ca", str(junk)], "--tls_ca " + str(junk) + " is not a PEM file"),
        (["torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--tls_cert",
          str(junk), "--tls_key", str(junk), "--savedir", str(tmp_path), "--xpid", "r"],
         "is not a PEM file"),
        # Its learner dialled its TLS env servers plainly, and waited for ever.
        (["torchbeast.polybeast", *LEARNER, "--tls_cert", str(junk), "--tls_key", str(junk),
          "--savedir", str(tmp_path), "--xpid", "r"], "dials it: give --tls_ca too"),
    ]  # fmt: skip
    for command, fragment in cases:
        result = warm_start.run([sys.executable, "-m", *command], timeout=60)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], result.stderr


def test_tls_files_that_are_pem_but_not_a_pair_or_not_readable_are_one_line(tmp_path):
    # gRPC said "Invalid cert chain file" in its own log lines, and the run stopped with
    # "cannot listen on ...: Failed to bind to address": the files were never named.
    pairs = []
    for name in ("a", "b"):
        key, cert = tmp_path / f"key_{name}.pem", tmp_path / f"cert_{name}.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
             "-out", cert, "-days", "1", "-subj", "/CN=localhost"],
            check=True, capture_output=True,
        )  # fmt: skip
        pairs.append((cert, key))
    (cert_a, key_a), (_, key_b) = pairs
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    address = f"127.0.0.1:{free_port()}"
    serve = ["torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--savedir",
             str(tmp_path), "--xpid", "r"]  # fmt: skip
    assert_each_says(
        [[*serve, "--tls_cert", str(cert_a), "--tls_key", str(key_b)]],
        f"error: --tls_cert {cert_a} and --tls_key {key_b} are not a certificate and its "
        "unencrypted private key (KEY_VALUES_MISMATCH): give the pair that was made together",
    )
    dial = ["torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1"]
    result = warm_start.run(
        [sys.executable, "-m", *dial, "--tls_ca", str(garbled)],
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"--tls_ca {garbled} holds no certificate OpenSSL can read" in line


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--clients_per_process", "3"], "--clients_per_process is for env clients that dial"),
        (["--client_steps", "50"], "--client_steps is for env clients that dial a learner"),
        (["--connect", "unix:/nonexistent", "--max_streams", "2"], "--max_streams is for env "
         "servers; with --connect these are env clients: leave --max_streams out"),
    ],
)  # fmt: skip
def test_an_env_flag_of_the_other_mode_is_refused(flags, said):
    # Each was ignored without a word: servers given --clients_per_process 3 served as one.
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_env", *ENV, *flags],
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert said in result.stderr.strip().splitlines()[-1]


def assert_each_says(commands: list[list[str]], line: str) -> None:
    """Each ``python -m`` command fails with exit code 1 and ``line`` alone on stderr."""
    for command in commands:
        result = warm_start.run(
            [sys.executable, "-m", *command],
            timeout=60,
        )  # fmt: skip
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().splitlines() == [line], command


def test_a_port_in_use_is_one_line_at_each_entry_point(tmp_path):
    # gRPC logged its own bind failure beside ours, and polybeast added a line about its
    # env processes' exit: three lines for one mistake.
    with socket.create_server(("127.0.0.1", 0)) as holder:
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        learner = [*LEARNER, "--savedir", str(tmp_path)]
        commands = [
            ["torchbeast.polybeast", *learner, "--env_servers", address, "--num_actors", "1"],
            ["torchbeast.polybeast", *learner, "--serve", address, "--num_actors", "1"],
            ["torchbeast.polybeast_learner", *learner, "--serve", address],
            ["torchbeast.polybeast_env", *ENV, "--env_servers", address],
        ]
        assert_each_says(
            commands,
            f"error: cannot listen on {address}: the port is in use (another run or server?): "
            "stop what holds it, or give another port",
        )


def test_a_unix_socket_another_process_serves_is_one_line_at_each_entry_point(tmp_path, sockets):
    # gRPC removed the socket file and served in its place: the first run was left
    # waiting on an address nothing could reach.
    path = f"{sockets}/taken"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as holder:
        holder.bind(path)
        holder.listen()
        inode = os.stat(path).st_ino
        learner = [*LEARNER, "--savedir", str(tmp_path)]
        commands = [
            ["torchbeast.polybeast", *learner, "--serve", f"unix:{path}", "--num_actors", "1"],
            ["torchbeast.polybeast_learner", *learner, "--serve", f"unix:{path}"],
            ["torchbeast.polybeast_env", *ENV, "--env_servers", f"unix:{path}"],
        ]
        assert_each_says(
            commands,
            f"error: cannot listen on unix:{path}: another process serves it (another run or "
            "env server?): stop it, or give another socket path",
        )
        assert os.stat(path).st_ino == inode  # still its socket


def test_a_unix_socket_path_is_checked_before_grpc_would_remove_what_is_there(sockets):
    from torchbeast.runtime.poly.network import NetworkError, check_can_listen

    stale = f"{sockets}/stale"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
        gone.bind(stale)  # left behind, as by a server killed with SIGKILL
    check_can_listen(f"unix:{stale}")  # gRPC replaces it
    a_file = f"{sockets}/notes.txt"
    with open(a_file, "w") as f:
        f.write("kept")
    with pytest.raises(NetworkError, match="notes.txt is a file, not a socket"):
        check_can_listen(f"unix:{a_file}")
    assert open(a_file).read() == "kept"


def test_a_unix_socket_path_too_long_for_the_os_is_refused_as_a_flag(tmp_path):
    path = "/tmp/" + "a" * 110
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_env", *ENV, "--connect", f"unix:{path}"],
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "has a socket path of 115 bytes, more than the 107 a Unix socket takes" in (
        result.stderr
    )


# --------------------------------------------------------------------------- refusals


def bad_stream(address: str, messages: list, token: str | None = "s3cret") -> grpc.RpcError:
    """Sends ``messages`` on one stream; returns the error the learner closed it with."""
    metadata = (("x-torchbeast-token", token),) if token else ()
    with grpc.insecure_channel(address) as channel:
        call = pb_grpc.LearnerStub(channel).ConnectEnv(
            iter(messages), metadata=metadata, timeout=30
        )
        with pytest.raises(grpc.RpcError) as error:
            list(call)
    return error.value


def step_of(observation: np.ndarray) -> pb.EnvMessage:
    return pb.EnvMessage(
        step=pb.Step(
            observation=pb.ArrayNest(array=codec.encode_array(observation)),
            reward=[0.0], done=[False], episode_end=[False], episode_return=[0.0],
            episode_step=[0],
        )
    )  # fmt: skip


def test_malformed_and_unauthenticated_streams_are_refused_and_training_goes_on(
    tmp_path, processes, sockets
):
    address = f"unix:{sockets}/learner"
    token = {"TORCHBEAST_AUTH_TOKEN": "s3cret"}
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--total_steps", "4000",
        "--savedir", str(tmp_path), "--xpid", "r", log=learner_log, env=token,
    )  # fmt: skip
    processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        log=tmp_path / "client.log", env=token,
    )  # fmt: skip
    wait_for(lambda: logged_steps(tmp_path / "r"), 90, "training to start")
    hello = env_hello("bad-client", CARTPOLE)
    good_frame = np.zeros((1, 4), np.float32)

    refusals = {
        "no token": bad_stream(address, [hello], token=None),
        "wrong token": bad_stream(address, [hello], token="guess"),
        "wrong dtype": bad_stream(address, [hello, step_of(good_frame.astype(np.int32))]),
        "wrong shape": bad_stream(address, [hello, step_of(np.zeros((1, 5), np.float32))]),
        "oversized": bad_stream(address, [hello, step_of(np.zeros((1, 2**20), np.float32))]),
        "other env": bad_stream(address, [env_hello("x", EnvSpec("Other-v0", (4,), np.dtype("float32"), 3))]),  # noqa: E501
    }  # fmt: skip
    codes = {name: error.code() for name, error in refusals.items()}
    assert codes == {
        "no token": grpc.StatusCode.UNAUTHENTICATED,
        "wrong token": grpc.StatusCode.UNAUTHENTICATED,
        "wrong dtype": grpc.StatusCode.INVALID_ARGUMENT,
        "wrong shape": grpc.StatusCode.INVALID_ARGUMENT,
        "oversized": grpc.StatusCode.INVALID_ARGUMENT,
        "other env": grpc.StatusCode.FAILED_PRECONDITION,
    }
    assert "exceeds the limit" in refusals["oversized"].details()
    # Anyone who reaches the port may knock: a flood of wrong tokens is 20 lines, not 60.
    for _ in range(58):
        assert bad_stream(address, [hello], token="guess").code() == codes["wrong token"]
    assert learner.wait(timeout=120) == 0, text(learner_log)
    log = text(learner_log)
    assert log.count("no valid auth token") == 20
    assert "Traceback" not in log


def test_a_learner_told_its_env_refuses_streams_of_envs_made_with_other_reward_flags(
    tmp_path, processes, sockets
):
    # The first stream decided the reward flags even where the learner was told them: one
    # told --fuel_multiplier 5 took envs of 2, then refused envs made as it was.
    # And it refused envs of its own proxy said otherwise (--fuel_multiplier 5 alone).
    riverraid = ["--env", "RiverraidNoFrameskip-v4", "--fuel_multiplier", "5"]
    address = f"unix:{sockets}/learner"
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *riverraid, "--move_penalty", "0", *LEARNER[2:],
        "--hidden_size", "64", "--serve", address, "--total_steps", "200",
        "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    spec = envs.env_spec(env_settings(make_env_parser().parse_args(riverraid)))
    wait_for(lambda: os.path.exists(f"{sockets}/learner"), 60, "the learner to listen")
    two = codec.hello("two", spec, 1, {"fuel_multiplier": 2.0, "no_fire_on_life_loss": False})
    bare = codec.hello("bare", spec)
    refusals = [bad_stream(address, [hello], token=None) for hello in (two, bare)]
    assert [error.code() for error in refusals] == [grpc.StatusCode.FAILED_PRECONDITION] * 2
    assert refusals[0].details() == (
        "environment made with --fuel_multiplier 2.0 --no_fire_on_life_loss False does not "
        "match the run's environments, made with --fuel_multiplier 5.0 --move_penalty 0.0 "
        "--no_fire_on_life_loss False"
    )
    assert "environment made with none does not match" in refusals[1].details()
    processes(
        "torchbeast.polybeast_env", *riverraid, "--connect", address, "--num_servers", "1",
        log=tmp_path / "client.log",
    )  # fmt: skip
    assert learner.wait(timeout=120) == 0, text(learner_log)


def test_a_learner_listening_beyond_this_machine_needs_a_token(tmp_path):
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", *LEARNER, "--serve",
         f"0.0.0.0:{free_port()}", "--savedir", str(tmp_path)],
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "TORCHBEAST_AUTH_TOKEN"},
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "without a token" in lines[0], result.stderr


def test_a_token_without_tls_beyond_this_machine_is_a_warning_at_both_ends(caplog, monkeypatch):
    from torchbeast.config.poly import NetworkSettings
    from torchbeast.runtime.poly import network

    monkeypatch.delenv("TORCHBEAST_AUTH_TOKEN", raising=False)
    settings = NetworkSettings(auth_token="s3cret")
    anywhere, local = f"0.0.0.0:{free_port()}", f"127.0.0.1:{free_port()}"
    with caplog.at_level("WARNING", logger="torchbeast"):
        for address in (anywhere, local):
            server, _port = network.create_server(settings, address, max_streams=2)
            server.stop(grace=None)
        for address in ("192.0.2.1:4431", local):  # a channel dials only when used
            network.create_channel(settings, address).close()
    clear = "the auth token and all traffic cross the network in the clear; add"
    assert [record.getMessage() for record in caplog.records] == [
        f"Listening on {anywhere} without TLS: {clear} --tls_cert and --tls_key to encrypt them.",
        f"Dialling 192.0.2.1:4431 without TLS: {clear} --tls_ca to encrypt them.",
    ]


def test_a_learner_without_the_env_servers_token_stops_with_one_line(tmp_path, processes, sockets):
    address = ["--num_servers", "1", "--pipes_basename", f"unix:{sockets}/env"]
    processes(
        "torchbeast.polybeast_env", *ENV, *address, log=tmp_path / "env.log",
        env={"TORCHBEAST_AUTH_TOKEN": "s3cret"},
    )  # fmt: skip
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", *LEARNER, *address,
         "--num_actors", "1", "--savedir", str(tmp_path)],
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "TORCHBEAST_AUTH_TOKEN"},
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the learner" in lines[0], result.stderr
    assert "no valid auth token" in text(tmp_path / "env.log")


def test_a_learner_for_another_env_than_its_servers_stops_with_one_line(
    tmp_path, processes, sockets
):
    address = ["--num_servers", "1", "--pipes_basename", f"unix:{sockets}/env"]
    processes("torchbeast.polybeast_env", *ENV, *address, log=tmp_path / "env.log")
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", *LEARNER, "--env",
         "PongNoFrameskip-v4", *address, "--num_actors", "1", "--savedir", str(tmp_path)],
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "CartPole-v1 (float32 [4], 2 actions) does not match the run's " in lines[0]
    assert "PongNoFrameskip-v4 (uint8 [4, 84, 84], 6 actions)" in lines[0]


# --------------------------------------------------------------------------- waiting, resume


def test_a_restarted_learner_resumes_and_its_clients_reconnect(tmp_path, processes, sockets):
    address = f"unix:{sockets}/learner"
    run = ["--serve", address, "--savedir", str(tmp_path), "--xpid", "r"]
    first_log = tmp_path / "learner1.log"
    first = processes(
        "torchbeast.polybeast_learner", *LEARNER, *run, "--total_steps", "100000", log=first_log
    )
    processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        log=tmp_path / "client.log",
    )  # fmt: skip
    wait_for(lambda: logged_steps(tmp_path / "r"), 90, "training to start")
    os.killpg(first.pid, signal.SIGTERM)
    assert first.wait(timeout=60) == STOPPED_BY_SIGTERM, text(first_log)
    saved = logged_steps(tmp_path / "r")[-1]

    second_log = tmp_path / "learner2.log"
    second = processes(
        "torchbeast.polybeast_learner", *LEARNER, *run, "--total_steps", str(saved + 400),
        log=second_log,
    )  # fmt: skip
    assert second.wait(timeout=120) == 0, text(second_log)
    assert "Resuming from" in text(second_log)
    assert logged_steps(tmp_path / "r")[-1] >= saved + 400


def test_a_learner_without_environments_says_so_once_and_waits(tmp_path, processes, sockets):
    address = f"unix:{sockets}/learner"
    learner_log = tmp_path / "learner.log"
    learner = processes(  # not told the env: it waits for the first to say what it is
        "torchbeast.polybeast_learner", *LEARNER[2:], "--serve", address, "--total_steps", "100000",
        "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    wait_for(lambda: "Waiting for the first environment" in text(learner_log), 60, "notice")
    processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        "--client_steps", "30", log=tmp_path / "client.log",
    )  # fmt: skip
    wait_for(lambda: "No environments connected" in text(learner_log), 60, "second notice")
    time.sleep(7)  # longer than the notice interval: it must not repeat
    log = text(learner_log)
    assert log.count("Waiting for the first environment") == 1
    assert log.count("No environments connected") == 1
    assert learner.poll() is None  # waiting, not gone
    os.killpg(learner.pid, signal.SIGINT)
    learner.wait(timeout=60)


def learner_told_no_env(tmp_path, processes, sockets):
    """A learner serving on a Unix socket, told no --env, once it listens: its address,
    process and log."""
    address = f"unix:{sockets}/learner"
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER[2:], "--serve", address, "--total_steps", "200",
        "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    wait_for(lambda: os.path.exists(f"{sockets}/learner"), 60, "the learner to listen")
    return address, learner, learner_log


def a_good_client_trains_it(tmp_path, processes, address, learner, learner_log) -> None:
    """A CartPole env client connects, and the learner trains to its end."""
    processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        log=tmp_path / "client.log",
    )  # fmt: skip
    assert learner.wait(timeout=120) == 0, text(learner_log)


def test_a_learner_told_no_env_refuses_a_first_env_it_does_not_know_and_waits(
    tmp_path, processes, sockets
):
    # It imported the module a peer named (the Zen of Python came out of its log), then
    # stopped the run: "unknown environment id".
    address, learner, learner_log = learner_told_no_env(tmp_path, processes, sockets)
    zen = dataclasses.replace(CARTPOLE, env_id="this:Zen-v0")
    unknown = dataclasses.replace(CARTPOLE, env_id="NoSuchGame-v0")
    refusals = [bad_stream(address, [env_hello("x", spec)], token=None) for spec in (zen, unknown)]
    assert [error.code() for error in refusals] == [grpc.StatusCode.FAILED_PRECONDITION] * 2
    assert refusals[0].details() == (
        "environment 'this:Zen-v0' names a module to import, and a learner imports no code a "
        "peer names: give the learner --env this:Zen-v0"
    )
    assert "unknown environment id 'NoSuchGame-v0'" in refusals[1].details()
    a_good_client_trains_it(tmp_path, processes, address, learner, learner_log)
    assert "Beautiful is better than ugly" not in text(learner_log)


def test_a_learner_told_no_env_refuses_a_first_env_whose_model_would_be_huge_and_waits(
    tmp_path, processes, sockets
):
    # A peer's [1, 1024, 1024] frames made the learner build a 504M-parameter AtariNet
    # (8 GB with its gradients and RMSprop's state) before any step.
    address, learner, learner_log = learner_told_no_env(tmp_path, processes, sockets)
    huge = dataclasses.replace(CARTPOLE, observation_shape=(1, 1024, 1024))
    refusal = bad_stream(address, [env_hello("x", huge)], token=None)
    assert refusal.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refusal.details() == (
        "environment CartPole-v1 (float32 [1, 1024, 1024], 2 actions) would make a model of "
        "504M parameters (--torso atari), more than the 100M a learner builds for what the "
        "first env stream says: give the learner --env CartPole-v1 to build it"
    )
    a_good_client_trains_it(tmp_path, processes, address, learner, learner_log)
    assert "mlp model, 4" in text(learner_log)  # CartPole's own, from the good client


def test_a_first_env_that_the_learners_torso_cannot_read_is_refused_not_the_run():
    # --torso atari told, CartPole's [4] said first: the model could not be built, and
    # the run stopped on a peer's word.
    run_spec = RunSpec(None, None, ModelSettings(torso="atari"))
    with pytest.raises(SpecMismatch) as error:
        run_spec.register("x", CARTPOLE, {})
    assert str(error.value).startswith("--torso atari reads [C, H, W] frames of at least 36x36")
    assert str(error.value).endswith("(the learner was not told --env)")
    assert run_spec.spec is None and not run_spec.known.is_set()  # it waits for another


def test_a_run_takes_envs_of_its_reward_proxy_however_the_proxy_was_spelled():
    # A learner told --fuel_multiplier 1 --move_penalty 0 refused every env server of
    # --move_penalty 0: one proxy (survival), compared as its flags were said.
    riverraid = ["--env", "RiverraidNoFrameskip-v4"]
    spec = envs.env_spec(env_settings(make_env_parser().parse_args(riverraid)))

    def options(*flags: str) -> dict[str, object]:
        parsed = env_settings(make_env_parser().parse_args([*riverraid, *flags]))
        return {name: value for name, value in parsed.options if value is not None}

    survival = options("--fuel_multiplier", "1", "--move_penalty", "0")
    run_spec = RunSpec(spec, survival)
    for flag in ("--fuel_multiplier 1", "--move_penalty 0", "--true_move_penalty 0"):
        run_spec.register("same", spec, options(*flag.split()))
    assert run_spec.env_options == survival  # the run's own words, as recorded
    refused = {
        "game score": options(),
        "fuel": options("--fuel_multiplier", "5"),
        "true move": options("--move_penalty", "0", "--true_move_penalty", "1"),
        "no fire": options("--move_penalty", "0", "--no_fire_on_life_loss"),
        "a peer's own": options("--move_penalty", "0") | {"frame_skip": 3},
    }
    for what, said in refused.items():
        with pytest.raises(SpecMismatch, match="does not match the run's environments"):
            run_spec.register(what, spec, said)
    # The game score, said with no options at all or with the defaults spelled out.
    score = RunSpec(spec, options())
    score.register("bare", spec, {})
    with pytest.raises(SpecMismatch):
        score.register("survival", spec, options("--move_penalty", "0"))


def test_a_first_envs_option_values_are_checked_before_the_run_takes_them(caplog):
    # {"fuel_multiplier": "x"} from the first stream became the run's proxy, and the
    # learner stopped with a TypeError as it read it ("x" >= 0).
    riverraid = "RiverraidNoFrameskip-v4"
    spec = envs.env_spec(env_settings(make_env_parser().parse_args(["--env", riverraid])))
    run_spec = RunSpec(None, None)
    for said, refused in (
        ({"fuel_multiplier": "x"}, "--fuel_multiplier x: could not convert"),
        ({"fuel_multiplier": True}, "--fuel_multiplier True: takes a value, not true or false"),
        ({"no_fire_on_life_loss": 0}, "--no_fire_on_life_loss 0: a switch takes true or false"),
    ):
        with pytest.raises(SpecMismatch, match=f"^environment made with {refused}"):
            run_spec.register("bad", spec, said)
        assert run_spec.spec is None and run_spec.env_options is None  # it waits for another
    run_spec.register("good", spec, {"fuel_multiplier": 5, "no_fire_on_life_loss": False})
    assert run_spec.env_options == {"fuel_multiplier": 5.0, "no_fire_on_life_loss": False}
    family = envs.family_of(riverraid)
    assert family.presets(riverraid, run_spec.env_options) == []  # the fuel proxy: none

    class Failing(envs.EnvFamily):  # a plug-in whose comparison breaks
        name = "Failing"

        def compared_options(self, options):
            raise RuntimeError("broken")

    from torchbeast.runtime.poly.run_spec import same_envs

    assert not same_envs(Failing(), {}, {})  # that stream is refused, not the run
    assert "Failing failed to compare env options: RuntimeError: broken" in caplog.text


def test_test_mode_plays_the_env_the_learner_was_trained_on(tmp_path, processes, sockets):
    address = f"unix:{sockets}/learner"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--total_steps", "200",
        "--savedir", str(tmp_path), "--xpid", "r", log=tmp_path / "learner.log",
    )  # fmt: skip
    processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "1",
        log=tmp_path / "client.log",
    )  # fmt: skip
    assert learner.wait(timeout=120) == 0, text(tmp_path / "learner.log")
    result = warm_start.run(
        [sys.executable, "-m", "torchbeast.polybeast_learner", "--mode", "test", "--xpid", "r",
         "--savedir", str(tmp_path), "--num_episodes", "2"],
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Average returns over 2 episodes" in result.stderr + result.stdout


def test_laser_replay_learns_online_steps_exactly_with_partial_rollouts(
    tmp_path, processes, sockets
):
    # Two clients leave after 110 steps each: 5 whole rollouts of 20 and one of 10 apiece.
    # The cut rollouts go into the replay with their masks; every online step counts once.
    address = f"unix:{sockets}/learner"
    learner_log = tmp_path / "learner.log"
    learner = processes(
        "torchbeast.polybeast_learner", *LEARNER, "--serve", address, "--total_steps", "220",
        "--replay_size", "1000", "--replay_ratio", "2", "--learn_start", "60",
        "--savedir", str(tmp_path), "--xpid", "r", log=learner_log,
    )  # fmt: skip
    client = processes(
        "torchbeast.polybeast_env", *ENV, "--connect", address, "--num_servers", "2",
        "--client_steps", "110", log=tmp_path / "client.log",
    )  # fmt: skip
    assert learner.wait(timeout=120) == 0, text(learner_log)
    assert client.wait(timeout=30) == 0, text(tmp_path / "client.log")
    rows = read_rows(tmp_path / "r" / "logs.csv")
    assert int(rows[-1]["step"]) == 220
    assert [int(row["replayed_columns"]) for row in rows[:1]] == [0]
    assert int(rows[-1]["replayed_columns"]) == 2 * 2  # B * replay_ratio
