"""``snapops demo``: the main job end to end on this machine (see :mod:`snapops.demo.run`)."""

from .run import run_demo  # noqa: F401
