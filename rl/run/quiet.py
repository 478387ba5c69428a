"""Library log lines a run does not show: orbax reports every file it writes (absl, INFO) and
JAX every platform it did not find (no TPU on a GPU host, and so on). Warnings still show."""

from __future__ import annotations

import logging


def quiet_library_logs() -> None:
    """Lower orbax's (absl) and JAX's platform probe's log level to WARNING."""
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
