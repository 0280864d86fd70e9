"""Agent networks: AtariNet (the original's), the IMPALA deep ResNet, MinAtar's small
convolution for grids, and an MLP.

Every model takes a dict of time-major inputs and a recurrent core state::

    frame        [T, B, *obs_shape]   uint8 pixels or float features
    reward       [T, B]               reward of the step that led to the frame
    done         [T, B]               the frame starts a new episode
    last_action  [T, B]               action that led to the frame

and returns ``(dict(policy_logits [T, B, A], baseline [T, B], action [T, B],
policy_version [T, B]), core_state)``; ``policy_version`` is the number of learner updates
behind the weights.
The torso embeds the frame; the core sees the embedding, the clipped reward and the
one-hot last action, optionally through an LSTM whose state is zeroed where an episode
starts; the heads give the policy logits and the baseline. Actions are sampled in train
mode and greedy (argmax) in eval mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from torchbeast.core.errors import UserError
from torchbeast.core.settings import ModelSettings
from torchbeast.core.torso_chunks import TorsoChunks

CoreState = tuple[torch.Tensor, ...]


def fully_connected(in_size: int, hidden_size: int, num_layers: int) -> nn.Sequential:
    """``num_layers`` Linear+ReLU layers: in_size -> hidden_size -> ... -> hidden_size."""
    layers: list[nn.Module] = []
    for i in range(num_layers):
        layers += [nn.Linear(in_size if i == 0 else hidden_size, hidden_size), nn.ReLU()]
    return nn.Sequential(*layers)


class AtariTorso(nn.Module):
    """Nature-DQN convolutions (32/64/64) then the fully connected layers."""

    # Whether a row's work is enough to split a batch's rows over threads (TorsoChunks).
    rows_worth_threads = True

    def __init__(self, observation_shape: Sequence[int], hidden_size: int, num_layers: int):
        super().__init__()
        channels = observation_shape[0]
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1),
            nn.ReLU(),
        )
        conv_size = self.convs(torch.zeros(1, *observation_shape)).numel()  # 3136 for 84x84
        self.fc = fully_connected(conv_size, hidden_size, num_layers)
        self.output_size = hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.convs(x.contiguous(memory_format=torch.channels_last))
        return self.fc(x.flatten(1))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ResNetTorso(nn.Module):
    """IMPALA deep torso: per stage conv 3x3 -> max-pool 3/2 -> two residual blocks."""

    rows_worth_threads = True

    def __init__(self, observation_shape: Sequence[int], hidden_size: int, num_layers: int):
        super().__init__()
        stages: list[nn.Module] = []
        in_channels = observation_shape[0]
        for channels in (16, 32, 32):
            stages += [
                nn.Conv2d(in_channels, channels, kernel_size=3, padding=1),
                nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
                ResidualBlock(channels),
                ResidualBlock(channels),
            ]
            in_channels = channels
        self.stages = nn.Sequential(*stages, nn.ReLU())
        conv_size = self.stages(torch.zeros(1, *observation_shape)).numel()  # 3872 for 84x84
        self.fc = fully_connected(conv_size, hidden_size, num_layers)
        self.output_size = hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(x.contiguous(memory_format=torch.channels_last))
        return self.fc(x.flatten(1))


class GridTorso(nn.Module):
    """A small convolution (16 filters of 3x3, as the MinAtar paper's agents) over an
    [H, W, C] grid of object channels, then the fully connected layers. Channels come
    last, as in Gymnasium's image spaces and MinAtar's observations."""

    rows_worth_threads = False

    def __init__(self, observation_shape: Sequence[int], hidden_size: int, num_layers: int):
        super().__init__()
        height, width, channels = observation_shape
        self.conv = nn.Sequential(nn.Conv2d(channels, 16, kernel_size=3), nn.ReLU())
        conv_size = 16 * (height - 2) * (width - 2)  # 1024 for MinAtar's 10x10
        self.fc = fully_connected(conv_size, hidden_size, num_layers)
        self.output_size = hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x.permute(0, 3, 1, 2))  # [N, H, W, C] -> [N, 16, H-2, W-2]
        return self.fc(x.flatten(1))


class MLPTorso(nn.Module):
    """Flattened observation through fully connected layers (CartPole, ...)."""

    rows_worth_threads = False

    def __init__(self, observation_shape: Sequence[int], hidden_size: int, num_layers: int):
        super().__init__()
        in_size = 1
        for dim in observation_shape:
            in_size *= dim
        self.fc = fully_connected(in_size, hidden_size, num_layers)
        self.output_size = hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class Agent(nn.Module):
    """Torso + core (optional LSTM) + policy and baseline heads."""

    def __init__(
        self,
        torso: nn.Module,
        num_actions: int,
        use_lstm: bool,
        lstm_layers: int = 2,
        compute_dtype: torch.dtype = torch.float32,
        torso_chunks: TorsoChunks | None = None,
    ):
        """``compute_dtype``: what the torso computes in (``core.precision``); the weights,
        the core and the heads are fp32 whatever it is. ``torso_chunks``: the torso's
        forward and backward passes over a batch's rows split over threads (a CPU
        learner's; ``core.torso_chunks``)."""
        super().__init__()
        self.torso = torso
        self.compute_dtype = compute_dtype
        self.torso_chunks = torso_chunks
        self.num_actions = num_actions
        self.use_lstm = use_lstm
        # The core sees the embedding, the clipped reward and the one-hot last action.
        core_size = torso.output_size + num_actions + 1
        self.core = nn.LSTM(core_size, core_size, lstm_layers) if use_lstm else None
        self.policy = nn.Linear(core_size, num_actions)
        self.baseline = nn.Linear(core_size, 1)
        # Learner updates behind these weights, carried into rollouts to measure policy lag;
        # not saved in checkpoints (the learner's update count is).
        self.register_buffer("policy_version", torch.zeros((), dtype=torch.int64), persistent=False)

    def initial_state(self, batch_size: int = 1) -> CoreState:
        if self.core is None:
            return ()
        shape = (self.core.num_layers, batch_size, self.core.hidden_size)
        return (torch.zeros(shape), torch.zeros(shape))

    def forward(
        self,
        inputs: dict[str, torch.Tensor],
        core_state: CoreState = (),
        *,
        act: bool = True,
        generator: torch.Generator | None = None,
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """Policy logits, baseline and (with ``act``) an action: sampled in training mode
        (from ``generator``, else the default one), the most likely in eval mode. The
        learner, which needs no action, passes ``act=False``; so does PolyBeast's
        inference, which samples where it can tell which rows are non-finite."""
        frame = inputs["frame"]  # [T, B, *obs_shape]
        T, B = frame.shape[:2]
        if self.torso_chunks is None:
            features = self.features(frame.flatten(0, 1))  # [T*B, H]
        else:
            features = self.torso_chunks(
                self.features, frame.flatten(0, 1), self.torso.parameters()
            )

        one_hot_last_action = F.one_hot(inputs["last_action"].flatten(0, 1), self.num_actions)
        clipped_reward = torch.clamp(inputs["reward"], -1, 1).reshape(T * B, 1)
        core_input = torch.cat([features, clipped_reward, one_hot_last_action.float()], dim=-1)

        if self.core is None:
            core_output = core_input
        else:
            core_input = core_input.view(T, B, -1)
            outputs = []
            not_done = (~inputs["done"]).float()  # [T, B]
            for step_input, step_not_done in zip(
                core_input.unbind(), not_done.unbind(), strict=True
            ):
                # Zero the state where a new episode starts.
                mask = step_not_done.view(1, -1, 1)
                core_state = tuple(mask * state for state in core_state)
                output, core_state = self.core(step_input.unsqueeze(0), core_state)
                outputs.append(output)
            core_output = torch.cat(outputs).flatten(0, 1)

        policy_logits = self.policy(core_output)  # [T*B, A]
        baseline = self.baseline(core_output)  # [T*B, 1]
        outputs = dict(
            policy_logits=policy_logits.view(T, B, self.num_actions),
            baseline=baseline.view(T, B),
            policy_version=self.policy_version.expand(T, B),
        )
        if act:
            try:
                outputs["action"] = self.choose(policy_logits, generator).view(T, B)
            except RuntimeError:  # non-finite outputs: say so where the env is to blame
                for name in ("frame", "reward"):
                    if inputs[name].is_floating_point() and not inputs[name].isfinite().all():
                        raise RuntimeError(
                            f"the environment's {'observations' if name == 'frame' else 'rewards'}"
                            " hold NaN or inf: fix (or clip) what its step returns"
                        ) from None
                raise
        return outputs, core_state

    def features(self, observations: torch.Tensor) -> torch.Tensor:
        """The torso's features [N, H] (fp32) of observations [N, *obs_shape]."""
        x = observations
        if x.dtype == torch.uint8:
            if x.dim() == 4:  # the conv torsos' layout, made while a pixel is one byte
                x = x.contiguous(memory_format=torch.channels_last)
            # Straight to the dtype the torso computes in: no fp32 copy of the pixels.
            x = x.to(self.compute_dtype).div_(255.0)
        else:
            x = x.float()
        lower = self.compute_dtype != torch.float32
        with torch.autocast(x.device.type, dtype=self.compute_dtype, enabled=lower):
            return self.torso(x).float()

    def choose(
        self, policy_logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Actions [N] for ``policy_logits`` [N, A]: sampled in training mode (from
        ``generator``, else the default one), the most likely in eval mode."""
        if self.training:
            probabilities = F.softmax(policy_logits, dim=1)
            try:
                return torch.multinomial(probabilities, num_samples=1, generator=generator)[:, 0]
            except RuntimeError:  # only after the fact: no check on the way of every step
                if torch.isfinite(policy_logits).all():
                    raise
                raise RuntimeError(
                    "the policy's outputs are non-finite: its weights broke (an update too "
                    "large: lower --learning_rate) or an observation is too large"
                ) from None
        return torch.argmax(policy_logits, dim=1)


def sampling_generator(device: torch.device) -> torch.Generator:
    """A generator of its own, seeded from the process's seed, for inference that samples
    actions in a thread beside the learner's (central inference, PolyBeast's streams).
    While the learner captures its update as a CUDA graph (``core.update_graph``), the
    device's default generator belongs to the capture: a draw from it in another thread
    fails ("Offset increment outside graph capture")."""
    generator = torch.Generator(device=device)
    generator.manual_seed((torch.initial_seed() + 1) % 2**63)  # not the default's draws
    return generator


def default_torso(observation_shape: Sequence[int]) -> str:
    """The torso that suits these observations: AtariNet for [C, 84, 84] frames, else an
    MLP. The grid conv is asked for with --torso grid: with the default
    entropy cost it lifted MinAtar SpaceInvaders but collapsed MinAtar Breakout's policy
    within 50K steps (see the manual: docs/results.md)."""
    if len(observation_shape) == 3 and min(observation_shape[1:]) >= 36:
        return "atari"
    return "mlp"


def check_torso(kind: str, observation_shape: Sequence[int]) -> None:
    """Refuses a torso that cannot read these observations."""
    shape = tuple(observation_shape)
    frames = len(shape) == 3 and min(shape[1:]) >= 36  # [C, H, W], as Atari's
    grid = len(shape) == 3 and min(shape[:2]) >= 3 and not frames  # [H, W, C], as MinAtar's
    if kind in ("atari", "resnet") and not frames:
        other = "grid" if grid else "mlp"
        raise UserError(
            f"--torso {kind} reads [C, H, W] frames of at least 36x36, not observations of "
            f"shape {shape}: leave out --torso (and --use_resnet) or use --torso {other}"
        )
    if kind == "grid" and not grid:
        other = "atari or resnet" if frames else "mlp"
        raise UserError(
            f"--torso grid reads [H, W, C] grids of at least 3x3, not observations of "
            f"shape {shape}: leave out --torso or use --torso {other}"
        )


def model_config(settings: ModelSettings, observation_shape: Sequence[int]) -> dict:
    """The architecture a run uses, resolved from its model settings; stored in
    checkpoints."""
    if settings.torso and settings.use_resnet and settings.torso != "resnet":
        raise UserError(
            f"--use_resnet asks for the ResNet torso, --torso (given, or the env's preset) "
            f"for {settings.torso}: leave out one of them (--no_presets leaves out a preset's)"
        )
    # --use_resnet is --torso resnet: refused, as it, where there are no frames to read.
    kind = settings.torso or ("resnet" if settings.use_resnet else default_torso(observation_shape))
    check_torso(kind, observation_shape)
    default_hidden = {"atari": 512, "resnet": 256, "grid": 128, "mlp": 64}[kind]
    default_layers = 2 if kind == "mlp" else 1
    return dict(
        kind=kind,
        hidden_size=settings.hidden_size or default_hidden,
        num_layers=settings.num_layers or default_layers,
        use_lstm=bool(settings.use_lstm),
    )


TORSOS = {"atari": AtariTorso, "resnet": ResNetTorso, "grid": GridTorso, "mlp": MLPTorso}


def torso_splits_rows(config: dict) -> bool:
    """Whether the torso of ``config`` does enough work per row that a learner splits a
    batch's rows over threads (``create_model``'s ``torso_threads``)."""
    return TORSOS[config["kind"]].rows_worth_threads


WEIGHT_INITS = ("orthogonal", "pytorch")


def orthogonal_init(model: Agent) -> None:
    """Orthogonal weights and zero biases, as PPO implementations start: gain sqrt(2) in the
    torso's ReLU layers, so that a frame's features keep their scale through the layers
    (PyTorch's default shrinks them about 36-fold through AtariNet, leaving the heads to
    see little but the last action), 0.01 for the policy head (a near-uniform first
    policy) and 1 for the baseline. The LSTM keeps PyTorch's initialisation."""
    layers = [m for m in model.torso.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    gains = [(layer, math.sqrt(2)) for layer in layers]
    gains += [(model.policy, 0.01), (model.baseline, 1.0)]
    with torch.no_grad():
        for layer, gain in gains:
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


def create_model(
    config: dict,
    observation_shape: Sequence[int],
    num_actions: int,
    weight_init: str = "pytorch",
    compute_dtype: torch.dtype = torch.float32,
    inference_only: bool = False,
    torso_threads: int = 1,
) -> Agent:
    """The agent of ``config``; ``weight_init`` (see WEIGHT_INITS) matters only for a model
    that is trained from scratch, since every other copy loads its weights;
    ``compute_dtype``: what its torso computes in (``core.precision.compute_dtype``).

    ``inference_only``: a copy that only acts (an actor's, an inference server's, a played
    checkpoint's) keeps its torso's weights in ``compute_dtype`` itself, so that they are
    cast when they are loaded, not at every forward pass (which cost bf16 actors a third
    of their inference time).

    ``torso_threads``: threads that share the torso's passes with gradient, each on its own
    rows of the batch (a CPU learner's, where ``torso_splits_rows``; ``core.torso_chunks``);
    1: the torso runs whole."""
    torso = TORSOS[config["kind"]](observation_shape, config["hidden_size"], config["num_layers"])
    chunks = TorsoChunks(torso_threads) if torso_threads > 1 else None
    model = Agent(
        torso,
        num_actions,
        use_lstm=config["use_lstm"],
        compute_dtype=compute_dtype,
        torso_chunks=chunks,
    )
    if weight_init == "orthogonal":
        orthogonal_init(model)
    elif weight_init != "pytorch":
        raise ValueError(f"unknown weight init {weight_init!r}: use one of {WEIGHT_INITS}")
    if config["kind"] != "mlp":
        model = model.to(memory_format=torch.channels_last)  # faster convolutions on CPU
    if inference_only:
        model.torso.to(compute_dtype)
    return model


def parameter_bound(config: dict, observation_shape: Sequence[int], num_actions: int) -> int:
    """A bound above the parameters of ``create_model(config, ...)``, without building it:
    the torso's convs (under a million weights) and first linear layer, which reads at
    most H x W values of the frame convs (their strides shrink it), 16 x H x W of the grid
    conv, every value of a flat observation; its further layers; the core (two LSTM
    layers of 4 gates: 16 x its size squared) and the heads."""
    hidden, layers = config["hidden_size"], config["num_layers"]
    shape = tuple(observation_shape)
    reads = {
        "atari": math.prod(shape[-2:]),
        "resnet": math.prod(shape[-2:]),
        "grid": 16 * math.prod(shape[:2]),
        "mlp": math.prod(shape),
    }[config["kind"]]
    core = hidden + num_actions + 1
    bound = 1_000_000 + (reads + 1) * hidden + (hidden + 1) * hidden * layers
    return bound + 17 * core**2 * config["use_lstm"] + (core + 1) * (num_actions + 1)


def parameters_over(
    config: dict, observation_shape: Sequence[int], num_actions: int, limit: int
) -> int | None:
    """The parameters of ``create_model(config, ...)`` where they are more than ``limit``,
    else None; without building it (and on the meta device, no memory, only where its
    ``parameter_bound`` passes the limit: counting a conv torso there costs a second)."""
    if parameter_bound(config, observation_shape, num_actions) <= limit:
        return None
    with torch.device("meta"):
        parameters = count_parameters(create_model(config, observation_shape, num_actions))
    return parameters if parameters > limit else None


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
