"""Package discovery for the top-level layout: formats/ -> snapops.formats, daemon/ ->
snapops.daemon, hooks/ -> snapops.hooks, config/ -> snapops.config (everything else is in
pyproject.toml). Discovering subpackages keeps new format packages installable without edits.
Two C extensions: byte kernels for WTXT's base64 lines and the residuals' unshuffling
(formats/_kernels.c) and interleaved SHA-256 (formats/_sha256.c); they need a C compiler and
the Python headers at install."""

from pathlib import Path

from setuptools import Extension, setup

ROOTS = {"snapops": "snapops", "snapops.formats": "formats", "snapops.daemon": "daemon",
         "snapops.hooks": "hooks", "snapops.config": "config"}


def discover() -> list[str]:
    found = []
    for package, folder in ROOTS.items():
        for init in sorted(Path(folder).rglob("__init__.py")):
            rel = init.parent.relative_to(folder).parts
            found.append(".".join((package, *rel)))
    return found


KERNELS = Extension("snapops.formats._kernels", ["formats/_kernels.c"],
                    extra_compile_args=["-O3"])

SHA256 = Extension("snapops.formats._sha256", ["formats/_sha256.c"], extra_compile_args=["-O3"])

setup(packages=discover(), package_dir=ROOTS, ext_modules=[KERNELS, SHA256])
