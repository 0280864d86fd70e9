"""Videos of a trained agent: test and eval modes record the games they play as the env
draws them (``--video FILE.gif``), as CleanRL's ``--capture_video`` and Sample Factory's
``--save_video`` do. GIF, written with Pillow (which matplotlib already brings): it plays
in a browser and on a README page without a codec."""

from __future__ import annotations

import numpy as np

from torchbeast.core.errors import UserError, unwritable

MIN_SIDE = 160  # pixels: smaller pictures (MinAtar's 10x10) are scaled up to at least this


class VideoError(UserError, ValueError):
    """--video cannot be written as asked."""


def check_path(path: str, writable: bool = True) -> None:
    """Refuses a --video that would not be a GIF, or (``writable``) could not be written,
    before any game is played (not after every game, losing their figures)."""
    if not path.lower().endswith(".gif"):
        raise VideoError(f"--video {path} must end in .gif: the games are written as a GIF")
    if writable and (problem := unwritable(path, "--video")):
        raise VideoError(problem)


class Recorder:
    """The pictures of the first ``steps`` agent steps (the reset's and each step's),
    written as a GIF of about ``fps`` pictures a second (15: Atari's speed, 4 frames a
    step; a GIF holds each picture's time in hundredths of a second, so 70 ms here)."""

    def __init__(self, path: str, steps: int, fps: float = 15.0):
        check_path(path)
        self.path, self.steps = path, steps
        self.frame_ms = 10 * max(2, round(100 / fps))  # browsers slow 0-1 hundredths down
        self.frames: list[np.ndarray] = []

    @property
    def full(self) -> bool:
        return len(self.frames) >= self.steps

    @property
    def seconds(self) -> float:
        return len(self.frames) * self.frame_ms / 1000

    def add(self, frame: np.ndarray) -> None:
        """Keeps one picture ([H, W] or [H, W, 3 or 4]: uint8, other integers in 0-255, or
        floats in [0, 1]) until it has enough."""
        if not self.full:
            self.frames.append(as_picture(frame))

    def save(self) -> int:
        """Writes the GIF; returns the number of pictures."""
        from PIL import Image

        images = [Image.fromarray(frame) for frame in self.frames]
        if not images:
            raise VideoError(f"no picture to write to {self.path}: the env drew none")
        images[0].save(
            self.path,
            save_all=True,
            append_images=images[1:],
            duration=self.frame_ms,
            loop=0,
            optimize=False,
        )
        return len(images)


def as_picture(frame: np.ndarray) -> np.ndarray:
    """An env's picture as uint8 [H, W, 3] (or RGBA [H, W, 4]), small ones scaled up (each
    pixel a block); a picture of another shape or kind is a VideoError."""
    frame = np.asarray(frame)
    colours = frame.shape[2] if frame.ndim == 3 else None
    if frame.ndim not in (2, 3) or colours not in (None, 3, 4) or 0 in frame.shape:
        raise VideoError(
            f"the env draws pictures of shape {list(frame.shape)}: --video records [H, W, 3] "
            "(RGB), [H, W, 4] (RGBA) or [H, W] (grey); play without --video"
        )
    if frame.dtype == np.bool_:
        frame = frame.astype(np.uint8) * 255
    elif np.issubdtype(frame.dtype, np.integer) and frame.dtype != np.uint8:
        frame = np.clip(frame, 0, 255).astype(np.uint8)  # e.g. int64 RGB
    elif np.issubdtype(frame.dtype, np.floating):  # e.g. MinAtar's floats in [0, 1]
        frame = (np.clip(np.nan_to_num(frame), 0.0, 1.0) * 255).round().astype(np.uint8)
    elif frame.dtype != np.uint8:
        raise VideoError(
            f"the env draws pictures of {frame.dtype}: --video records numbers (uint8, or "
            "floats in [0, 1]); play without --video"
        )
    if frame.ndim == 2:
        frame = np.repeat(frame[:, :, None], 3, axis=2)
    scale = max(1, -(-MIN_SIDE // min(frame.shape[:2])))  # ceil
    if scale > 1:
        frame = frame.repeat(scale, axis=0).repeat(scale, axis=1)
    return frame
