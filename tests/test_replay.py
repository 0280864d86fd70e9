"""Specification of LASER's shared replay: each step stored once, exact replay, FIFO by episode."""

import threading

import pytest
import torch

from torchbeast.core.replay import Replay

T = 4  # unroll length
NUM_ACTIONS = 3
LAYERS, HIDDEN = 1, 2


def step(source: int, index: int, episode_length: int) -> dict[str, torch.Tensor]:
    """Step ``index`` of env stream ``source``: every value is a function of the two.

    Episodes last ``episode_length`` steps: step k * episode_length (k > 0) is the first
    frame of a new episode, so it carries done.
    """
    done = index > 0 and index % episode_length == 0
    episode_step = episode_length if done else index % episode_length
    return dict(
        frame=torch.tensor([source, index], dtype=torch.int64),
        reward=torch.tensor(float(index)),
        done=torch.tensor(done),
        episode_return=torch.tensor(float(source * 1000 + index)),
        episode_step=torch.tensor(episode_step, dtype=torch.int32),
        episode_end=torch.tensor(done),
        action=torch.tensor(index % NUM_ACTIONS),
        policy_logits=torch.tensor([float(index), float(-index), float(source)]),
        baseline=torch.tensor(float(index) / 10),
    )


def rollout(
    source: int, start: int, episode_length: int = 100, length: int = T
) -> dict[str, torch.Tensor]:
    """One column [T+1] of steps start..start+T; only ``length`` new steps are real."""
    steps = [step(source, start + t, episode_length) for t in range(length + 1)]
    column = {key: torch.stack([s[key] for s in steps]) for key in steps[0]}
    column = {
        key: torch.cat([tensor, torch.zeros((T - length, *tensor.shape[1:]), dtype=tensor.dtype)])
        for key, tensor in column.items()
    }
    column["mask"] = torch.arange(T + 1) <= length
    return column


def batch_of(columns: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Columns [T+1, ...] stacked into a batch [T+1, B, ...]."""
    return {key: torch.stack([column[key] for column in columns], dim=1) for key in columns[0]}


def core_state_of(starts: list[int]) -> tuple[torch.Tensor, ...]:
    """A recurrent state [layers, B, H] per column, distinct for each rollout start."""
    values = torch.tensor(starts, dtype=torch.float32) + 0.5
    hidden = values.view(1, -1, 1).expand(LAYERS, -1, HIDDEN).clone()
    return hidden, -hidden


def add(
    replay: Replay,
    source: int,
    start: int,
    episode_length: int = 100,
    length: int = T,
) -> dict[str, torch.Tensor]:
    """Adds one rollout of one source; returns the column as the learner saw it."""
    column = rollout(source, start, episode_length, length)
    replay.add(batch_of([column]), core_state_of([start]), [source])
    return column


def frame_ids(batch: dict[str, torch.Tensor], column: int) -> list[int]:
    """Step indices of the real steps of one column."""
    real = batch["mask"][:, column]
    return batch["frame"][real, column, 1].tolist()


def stored_columns(replay: Replay) -> list[list[int]]:
    """Each stored segment as the step indices of its column, oldest first."""
    batch, _ = replay.contents()
    return [frame_ids(batch, column) for column in range(batch["mask"].shape[1])]


def assert_same_column(actual: dict, column: int, expected: dict) -> None:
    for key, tensor in expected.items():
        assert torch.equal(actual[key][:, column], tensor), key


def test_each_step_is_stored_once():
    replay = Replay(capacity=100, learn_start=0)
    for k in range(3):
        add(replay, source=0, start=k * T)
    assert replay.transitions == 3 * T
    assert replay.stored_steps == 3 * T + 1
    assert stored_columns(replay) == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9, 10, 11, 12]]


def test_forget_drops_every_step_of_its_sources_and_keeps_the_others():
    replay = Replay(capacity=100, learn_start=0)
    for k in range(3):
        add(replay, source=0, start=k * T)
        add(replay, source=1, start=k * T)
    replay.forget({1})
    assert replay.transitions == 3 * T
    assert replay.stored_steps == 3 * T + 1
    batch, _ = replay.contents()
    assert set(batch["frame"][0, :, 0].tolist()) == {0}
    add(replay, source=1, start=3 * T)  # a forgotten source starts a new chain
    assert replay.transitions == 4 * T


def test_a_sampled_column_equals_the_online_column():
    replay = Replay(capacity=100, learn_start=0)
    add(replay, source=0, start=0)
    online = add(replay, source=0, start=T)
    replay.add(batch_of([rollout(1, 0)]), core_state_of([99]), [1])
    batch, (hidden, cell) = replay.contents()
    assert_same_column(batch, 1, online)
    assert batch["mask"][:, 1].all()
    expected_hidden, expected_cell = core_state_of([T])
    assert torch.equal(hidden[:, 1:2], expected_hidden)
    assert torch.equal(cell[:, 1:2], expected_cell)


def test_sample_returns_the_stored_columns():
    replay = Replay(capacity=100, learn_start=0)
    online = add(replay, source=0, start=0)
    batch, (hidden, _) = replay.sample(3)
    for column in range(3):
        assert_same_column(batch, column, online)
    assert torch.equal(hidden, core_state_of([0, 0, 0])[0])


def test_a_cut_short_rollout_is_stored_as_its_real_steps():
    replay = Replay(capacity=100, learn_start=0)
    online = add(replay, source=0, start=0, length=2)
    assert replay.transitions == 2
    batch, _ = replay.sample(1)
    assert_same_column(batch, 0, online)
    assert batch["mask"][:, 0].tolist() == [True, True, True, False, False]
    for key in online:
        assert not batch[key][3:].any(), key


def test_a_cut_short_rollout_ends_its_chain():
    replay = Replay(capacity=100, learn_start=0)
    add(replay, source=0, start=0, length=2)
    add(replay, source=0, start=2)
    assert replay.stored_steps == (2 + 1) + (T + 1)
    assert stored_columns(replay) == [[0, 1, 2], [2, 3, 4, 5, 6]]


def test_sample_waits_for_learn_start():
    replay = Replay(capacity=100, learn_start=2 * T)
    add(replay, source=0, start=0)
    assert replay.sample(2) is None
    add(replay, source=0, start=T)
    batch, _ = replay.sample(2)
    assert batch["frame"].shape == (T + 1, 2, 2)


def test_learn_start_above_capacity_still_starts():
    replay = Replay(capacity=T, learn_start=10 * T)
    add(replay, source=0, start=0)
    assert replay.sample(1) is not None


def test_the_oldest_episode_is_evicted_whole():
    # Source 0's episodes end at steps 3, 6, 9; source 1's at step 5.
    replay = Replay(capacity=10, learn_start=0)
    add(replay, source=0, start=0, episode_length=3)
    add(replay, source=1, start=0, episode_length=5)
    add(replay, source=0, start=T, episode_length=3)
    # 12 > 10: source 0's first episode (steps 1..3) goes; step 3 stays as a head.
    assert replay.transitions == 9
    assert stored_columns(replay) == [[3, 4], [0, 1, 2, 3, 4], [4, 5, 6, 7, 8]]


def test_an_episode_spanning_segments_is_evicted_across_them():
    replay = Replay(capacity=10, learn_start=0)
    add(replay, source=0, start=0, episode_length=3)
    add(replay, source=1, start=0, episode_length=5)
    add(replay, source=0, start=T, episode_length=3)
    add(replay, source=1, start=T, episode_length=5)
    # 13 > 10: source 0's episode of steps 4..6 goes, across its two segments.
    assert replay.transitions == 10
    assert replay.stored_steps == 10 + 2
    assert stored_columns(replay) == [[0, 1, 2, 3, 4], [6, 7, 8], [4, 5, 6, 7, 8]]


def test_a_segment_whose_start_was_evicted_replays_from_zero_state():
    replay = Replay(capacity=T + 1, learn_start=0)
    add(replay, source=0, start=0, episode_length=3)
    add(replay, source=1, start=0, episode_length=100)
    # Source 0's steps 1..3 go; the segment now starts at the done step 3.
    batch, (hidden, cell) = replay.contents()
    assert frame_ids(batch, 0) == [3, 4]
    assert bool(batch["done"][0, 0])
    assert torch.equal(hidden[:, 0], torch.zeros(LAYERS, HIDDEN))
    assert torch.equal(cell[:, 0], torch.zeros(LAYERS, HIDDEN))
    assert not batch["frame"][2:, 0].any()


def test_the_stored_part_of_an_unfinished_episode_is_evicted_whole():
    replay = Replay(capacity=T, learn_start=0)
    add(replay, source=0, start=0)
    add(replay, source=0, start=T)
    assert replay.transitions == 0
    assert replay.contents() is None
    assert replay.episodes_evicted == 1
    add(replay, source=0, start=2 * T)  # the emptied chain is forgotten: a new one starts
    assert stored_columns(replay) == [[8, 9, 10, 11, 12]]


def test_transitions_never_exceed_capacity():
    replay = Replay(capacity=7, learn_start=0)
    for k in range(20):
        columns = [rollout(0, k * T, episode_length=3), rollout(1, k * T, episode_length=5)]
        replay.add(batch_of(columns), core_state_of([k * T, k * T]), [0, 1])
        assert 0 < replay.transitions <= 7


def test_interleaved_sources_chain_separately():
    replay = Replay(capacity=100, learn_start=0)
    for k in range(2):
        columns = [rollout(7, k * T), rollout(8, 10 + k * T)]
        replay.add(batch_of(columns), core_state_of([k * T, 10 + k * T]), ["a", "b"])
    assert replay.stored_steps == 4 * T + 2
    batch, _ = replay.contents()
    assert batch["frame"][:, :, 0].tolist() == [[7, 8, 7, 8]] * (T + 1)
    assert [frame_ids(batch, column) for column in range(4)] == [
        [0, 1, 2, 3, 4],
        [10, 11, 12, 13, 14],
        [4, 5, 6, 7, 8],
        [14, 15, 16, 17, 18],
    ]


def test_a_reused_source_with_other_content_starts_a_new_chain():
    replay = Replay(capacity=100, learn_start=0)
    add(replay, source=0, start=0)
    add(replay, source=0, start=50)  # a restarted actor reusing the id
    assert replay.stored_steps == 2 * (T + 1)
    assert stored_columns(replay) == [[0, 1, 2, 3, 4], [50, 51, 52, 53, 54]]


def test_a_reused_source_with_the_same_frame_but_another_episode_step_starts_a_new_chain():
    replay = Replay(capacity=100, learn_start=0)
    add(replay, source=0, start=0)
    column = rollout(0, T)
    column["episode_step"][0] = 0  # a fresh episode whose first frame looks the same
    replay.add(batch_of([column]), core_state_of([T]), [0])
    assert replay.stored_steps == 2 * (T + 1)
    batch, _ = replay.contents()
    assert batch["episode_step"][0, 1] == 0


def test_a_feed_forward_replay_has_an_empty_core_state():
    replay = Replay(capacity=100, learn_start=0)
    replay.add(batch_of([rollout(0, 0)]), (), [0])
    _, core_state = replay.sample(2)
    assert core_state == ()


def test_concurrent_adds_and_samples_keep_exact_counts():
    replay = Replay(capacity=10_000, learn_start=1)
    rollouts_per_thread = 30
    malformed = []

    def actor(source: int) -> None:
        for k in range(rollouts_per_thread):
            add(replay, source=source, start=k * T, length=T if k % 7 else T - 1)
            sampled = replay.sample(4)
            if sampled is None:
                continue
            batch, _ = sampled
            for column in range(4):
                mask = batch["mask"][:, column]
                real = int(mask.sum())
                ids = frame_ids(batch, column)
                sources = batch["frame"][:real, column, 0]
                if not mask[:real].all() or ids != list(range(ids[0], ids[0] + real)):
                    malformed.append(ids)
                if not (sources == sources[0]).all():
                    malformed.append(ids)

    threads = [threading.Thread(target=actor, args=(source,)) for source in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Rollouts k = 0, 7, 14, 21, 28 are cut short by one step.
    assert replay.transitions == 4 * (rollouts_per_thread * T - 5)
    assert malformed == []


def test_sampling_is_uniform_over_segments():
    replay = Replay(capacity=100, learn_start=0)
    add(replay, source=0, start=0)
    add(replay, source=1, start=0, length=1)  # short segments are drawn as often
    generator = torch.Generator().manual_seed(0)
    batch, _ = replay.sample(2000, generator=generator)
    from_source_0 = int((batch["frame"][0, :, 0] == 0).sum())
    assert 850 < from_source_0 < 1150


# --------------------------------------------------------------------------- saved and restored


def layout_of(replay: Replay) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """One step's shape and dtype per key, as a run knows them from its rollout spec."""
    batch, _ = replay.contents()
    return {key: (t.shape[2:], t.dtype) for key, t in batch.items() if key != "mask"}


CORE_STATE_SHAPES = [torch.Size([LAYERS, 1, HIDDEN])] * 2


def saved_and_restored(replay: Replay, max_transitions: int, capacity: int = 1000) -> Replay:
    """A new replay restored from ``replay``'s state dict, through a file as a run does."""
    restored = Replay(capacity, learn_start=1)
    state = replay.state_dict(max_transitions)
    restored.load_state_dict(state, layout_of(replay), T, CORE_STATE_SHAPES)
    return restored


def filled_replay() -> Replay:
    """Two sources of three rollouts each, the second's first episode ending at step 6."""
    replay = Replay(capacity=1000, learn_start=1)
    for start in range(0, 12, T):
        add(replay, source=0, start=start)
        add(replay, source=1, start=start, episode_length=6)
    return replay


def test_a_restored_replay_holds_the_same_columns_and_core_states(tmp_path):
    replay = filled_replay()
    torch.save(replay.state_dict(max_transitions=10**6), tmp_path / "replay.tar")
    restored = Replay(1000, learn_start=1)
    state = torch.load(tmp_path / "replay.tar", weights_only=True)
    restored.load_state_dict(state, layout_of(replay), T, CORE_STATE_SHAPES)
    assert restored.transitions == replay.transitions == 24
    (batch, core_state), (restored_batch, restored_core_state) = (
        replay.contents(),
        restored.contents(),
    )
    for key, tensor in batch.items():
        assert torch.equal(restored_batch[key], tensor), key
    for state, restored_state in zip(core_state, restored_core_state, strict=True):
        assert torch.equal(restored_state, state)


def test_a_bounded_save_keeps_the_newest_segments_with_their_first_steps():
    replay = filled_replay()
    restored = saved_and_restored(replay, max_transitions=10)  # the last two segments fit
    assert restored.transitions == 8
    # Each kept segment replays as it did: its index 0 comes from the segment not kept.
    assert stored_columns(restored) == stored_columns(replay)[-2:]


def test_restored_chains_end_so_a_new_rollout_of_a_source_starts_its_own():
    replay = filled_replay()
    restored = saved_and_restored(replay, max_transitions=10**6)
    # The env stream 0 of the resumed run starts anew; its step 12 would have continued
    # the saved chain, but the episodes in progress are not resumed.
    add(restored, source=0, start=12)
    assert stored_columns(restored)[-1] == [12, 13, 14, 15, 16]
    assert restored.transitions == 24 + 4


def test_a_restored_replay_beyond_the_capacity_evicts_its_oldest_episodes():
    replay = filled_replay()
    restored = saved_and_restored(replay, max_transitions=10**6, capacity=16)
    assert restored.transitions <= 16
    assert stored_columns(restored)[-1] == stored_columns(replay)[-1]


def test_a_replay_saved_before_rollouts_carried_truncation_values_is_restored_with_zeros():
    replay = filled_replay()
    state = replay.state_dict(max_transitions=10**6)  # rollouts without the column
    layout = layout_of(replay) | {"truncation_value": (torch.Size([]), torch.float32)}
    restored = Replay(1000, learn_start=1)
    restored.load_state_dict(state, layout, T, CORE_STATE_SHAPES)
    assert restored.transitions == replay.transitions == 24
    (batch, _), (restored_batch, _) = replay.contents(), restored.contents()
    for key, tensor in batch.items():
        assert torch.equal(restored_batch[key], tensor), key
    values = restored_batch["truncation_value"]
    assert values.shape == batch["reward"].shape and not values.any()
    sampled, _ = restored.sample(4, generator=torch.Generator().manual_seed(0))
    assert sampled["truncation_value"].shape == sampled["reward"].shape


def test_a_saved_replay_of_other_rollouts_is_refused():
    replay = filled_replay()
    state = replay.state_dict(max_transitions=10**6)
    layout = layout_of(replay)
    other = Replay(1000, learn_start=1)
    wider = dict(layout, frame=(torch.Size([3]), torch.int64))
    for args in [
        (wider, T, CORE_STATE_SHAPES),
        (layout, T + 1, CORE_STATE_SHAPES),
        (layout, T, []),
    ]:
        with pytest.raises(ValueError):
            other.load_state_dict(state, *args)
    assert other.transitions == 0
    forged = replay.state_dict(max_transitions=10**6)
    forged["segments"][0]["steps"]["reward"] = torch.zeros(T + 7)  # longer than a rollout
    with pytest.raises(ValueError, match="do not fit"):
        other.load_state_dict(forged, layout, T, CORE_STATE_SHAPES)
