"""The install extras pin the JAX the library is built and tested with: the accelerator
extras the same jax version as each other and as the one installed, inside the core
dependency's range, and tpu-plan the libtpu that very jax's own tpu extra requires (read from
the installed jax's metadata, not written here)."""

import importlib.metadata as md
import re
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

from tests.paths import ROOT


def test_every_extra_pins_the_jax_of_the_core():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = next(Requirement(r) for r in project["dependencies"] if r.startswith("jax"))
    extras = project["optional-dependencies"]
    pins = {name: Requirement(r) for name, reqs in extras.items() for r in reqs
            if Requirement(r).name == "jax"}
    assert {"cuda12", "tpu"} <= set(pins)  # the GPU and the TPU runtime
    installed = Version(md.version("jax"))
    for name, req in pins.items():
        (spec,) = req.specifier
        assert spec.operator == "==" and Version(spec.version) == installed, (name, req)
        assert installed in core.specifier, (name, core)
    # tpu-plan's libtpu is the one jax's own tpu extra names
    wanted = next(Requirement(r) for r in md.requires("jax")
                  if r.startswith("libtpu") and 'extra == "tpu"' in r)
    (libtpu,) = [Requirement(r) for r in extras["tpu-plan"] if r.startswith("libtpu")]
    assert str(libtpu.specifier) == str(wanted.specifier)
    assert re.search(r"jax\[tpu\]", " ".join(extras["tpu"]))
