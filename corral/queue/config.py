"""The queues file: read from disk here (the only I/O of the queues' configuration); parsed and validated by the
pure `corral.tenancy.config` (docs/tenancy.md, docs/queues.md)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral.tenancy.config import MAX_FILE_BYTES, QueueConfigError, QueuesConfig, parse_queues


def load_queues(path: Path) -> QueuesConfig:
    """The queues file at `path`, read (a regular file, at most MAX_FILE_BYTES of UTF-8) and parsed; QueueConfigError
    naming the file otherwise."""
    try:
        # O_NONBLOCK and the check on the open descriptor: a FIFO or a device put there would block a reload (which
        # may run under the daemon's lock) or never end; only a regular file is read.
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise QueueConfigError(f"{path}: not a regular file (a queues file is a TOML file)")
            data = f.read(MAX_FILE_BYTES + 1)  # no further: a larger file is refused by its size
    except OSError as exc:
        raise QueueConfigError(f"{path}: cannot read the queues file: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise QueueConfigError(
            f"{path}: the file is more than {MAX_FILE_BYTES} bytes (a queues file may have at most {MAX_FILE_BYTES})"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise QueueConfigError(f"{path}: not UTF-8 text") from None
    return parse_queues(text, str(path))


__all__ = ["load_queues"]
