"""Stacking rollout columns into the learner's batch, as RayBeast and PolyBeast do."""

import numpy as np
import torch

from torchbeast.core.rollout import stack_columns, stack_core_states


def columns(make):
    """Two rollouts of T+1 = 3 steps: frames [3, 2] and rewards [3], column b holds b."""
    return [
        {"frame": make(np.full((3, 2), b, np.uint8)), "reward": make(np.full(3, b, np.float32))}
        for b in range(2)
    ]


def test_stack_columns_of_numpy_arrays_puts_the_batch_on_dim_1():
    batch = stack_columns(columns(lambda array: array))
    assert batch["frame"].shape == (3, 2, 2) and batch["frame"].dtype == torch.uint8
    assert batch["reward"].tolist() == [[0.0, 1.0]] * 3


def test_stack_columns_of_tensors_equals_that_of_numpy_arrays():
    from_numpy = stack_columns(columns(lambda array: array))
    from_tensors = stack_columns(columns(torch.from_numpy))
    assert from_numpy.keys() == from_tensors.keys()
    for key in from_numpy:
        assert torch.equal(from_numpy[key], from_tensors[key])


def test_stack_columns_copies_out_of_the_columns():
    given = columns(torch.from_numpy)
    batch = stack_columns(given)
    given[0]["reward"][0] = 7.0
    assert batch["reward"][0, 0] == 0.0


def test_stack_core_states_concatenates_the_batch_dim():
    states = [
        (np.full((1, 1, 4), b, np.float32), np.full((1, 1, 4), -b, np.float32)) for b in range(3)
    ]
    h, c = stack_core_states(states)
    assert h.shape == c.shape == (1, 3, 4)
    assert h[0, :, 0].tolist() == [0.0, 1.0, 2.0] and c[0, :, 0].tolist() == [0.0, -1.0, -2.0]
