"""The install lock of seqmix: requirements/lock.txt, a pip constraints file.

    python tools/lock.py names EXTRAS         the names of seqmix's dependencies and of the given
                                              extras (comma separated), without version ranges:
                                              what `make test-latest` upgrades to the newest release
    python tools/lock.py write FREEZE LOCK    writes LOCK from FREEZE (the `pip freeze --all` of the
                                              venv whose whole test suite just passed)

`make setup` / `make test` / `make main` / `.ci/run` install with `pip install -c LOCK`, so a release
upstream cannot change what a fresh clone runs. `make lock` moves the lock: it builds .venv-latest
with the newest release of every dependency, runs the whole suite there, and only when it passes
writes the lock from that venv (README, "Installed versions").
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the lock pins the public release of torch: the local CPU build (2.13.0+cpu) satisfies "torch==2.13.0"
LOCAL_VERSION = re.compile(r"\+[A-Za-z0-9.]+$")


def names(extras: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in filter(None, extras.split(",")):
        if extra not in optional:
            raise SystemExit(f"tools/lock.py names: unknown extra {extra!r} (pyproject has {', '.join(sorted(optional))})")
        reqs += optional[extra]
    out = []
    for r in reqs:
        name = re.match(r"[A-Za-z0-9_.\-]+", r).group(0)
        if name.lower() not in {n.lower() for n in out}:
            out.append(name)
    return out


def write(freeze: Path, lock: Path) -> None:
    pins = []
    for line in freeze.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e", "-")) or " @ " in line:
            continue  # the editable seqmix itself, and anything not from the index
        name, _, version = line.partition("==")
        if not version:
            raise SystemExit(f"tools/lock.py write: {freeze}: expected 'name==version', got {line!r}")
        pins.append(f"{name}=={LOCAL_VERSION.sub('', version)}")
    pins.sort(key=str.lower)
    header = ["# seqmix's install lock (pip constraints): every package the tests run with, at the version they",
              "# passed with. Written by `make lock` (tools/lock.py) after the whole suite passed in .venv-latest;",
              f"# Python {sys.version_info.major}.{sys.version_info.minor}. Do not edit by hand: README, 'Installed versions'."]
    lock.write_text("\n".join(header + pins) + "\n")
    print(f"wrote {lock}: {len(pins)} packages")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "names":
        print(" ".join(names(sys.argv[2])))
    elif len(sys.argv) == 4 and sys.argv[1] == "write":
        write(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        raise SystemExit(__doc__)
