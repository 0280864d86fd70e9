"""episodes.csv in the run folder: one row per episode an env stream ended or left."""

from __future__ import annotations

import csv
import os
import threading
import time


class EpisodeLog:
    """episodes.csv in the run folder: one row per finished episode, with the client."""

    FIELDS = ("time", "client_id", "episode_return", "episode_step", "end")

    def __init__(self, path: str):
        new = not os.path.exists(path)
        self.file = open(path, "a", newline="")  # noqa: SIM115 (closed in close())
        self.writer = csv.writer(self.file)
        self.lock = threading.Lock()
        if new:
            self.writer.writerow(self.FIELDS)

    def write(self, client_id: str, episode_return: float, episode_step: int, end: str) -> None:
        with self.lock:
            self.writer.writerow(
                (f"{time.time():.3f}", client_id, episode_return, episode_step, end)
            )
            self.file.flush()

    def close(self) -> None:
        with self.lock:
            self.file.close()


def client_id_of(client_id: str, env: int, num_envs: int) -> str:
    """The id an env of a stream is logged under: the client's, plus its index if several."""
    return client_id if num_envs == 1 else f"{client_id}/{env}"
