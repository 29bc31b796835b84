"""Check the running environment against requirements.lock; scripts/setup_env.sh runs it after installing.

Set-up installs the lock with --no-deps, so nothing outside it is ever resolved. This check proves the locked set is
complete and is what is installed: every pin is installed at its version, and every requirement of envace (with its
dev, bench, models, mcp and vs-trl extras) and of each locked package (except those marked ``# no-deps``) is in the lock
and met by its pin. It prints one line per problem and exits 1, naming the fix.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"
EXTRAS = frozenset({"dev", "bench", "models", "mcp", "vs-trl"})  # the extras scripts/lock.sh resolves


def read_lock(path: Path = LOCK) -> tuple[dict[str, Requirement], set[str]]:
    """The lock's pins by normalised name (those whose marker applies here), and the names marked ``# no-deps``."""
    pins: dict[str, Requirement] = {}
    no_deps: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text, _, comment = line.partition("#")
        if not text.strip():
            continue
        try:
            req = Requirement(text.strip())
        except ValueError as e:
            raise SystemExit(f"{path}:{number}: {e}") from None
        if req.marker is None or req.marker.evaluate():
            name = canonicalize_name(req.name)
            pins[name] = req
            if comment.strip() == "no-deps":
                no_deps.add(name)
    return pins, no_deps


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def problems(path: Path = LOCK) -> list[str]:
    """Every mismatch between the lock and the installed environment, one line each."""
    pins, no_deps = read_lock(path)
    out = []
    for name, req in pins.items():
        version = _installed(name)
        if version is None:
            out.append(f"{req} is locked but not installed")
        elif not req.specifier.contains(version, prereleases=True):
            out.append(f"{req} is locked but {name} {version} is installed")
    todo = [("envace", EXTRAS)] + [(name, frozenset()) for name in pins if name not in no_deps]
    seen = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or _installed(name) is None:
            continue
        seen.add((name, extras))
        for line in metadata.distribution(name).requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
                continue
            dep, shown = canonicalize_name(req.name), str(req).split(";")[0].strip()
            version = _installed(dep)
            if dep not in pins:
                out.append(f"{name} requires {shown}, which is not in the lock")
            elif version is not None and not req.specifier.contains(version, prereleases=True):
                out.append(f"{name} requires {shown}, but {dep} {version} is installed")
            if req.extras:
                todo.append((dep, frozenset(req.extras)))
    if _installed("envace") is None:
        out.append("envace is not installed")
    return list(dict.fromkeys(out))


def main() -> int:
    """Report the problems on stderr; exit status 1 if there are any."""
    found = problems()
    if any(line.endswith("not in the lock") for line in found):
        found.append("refresh the lock with scripts/lock.sh (pyproject.toml asks for more than it pins)")
    elif found:
        found.append("re-install from it: rm .venv/.envace-installed && scripts/setup_env.sh")
    sys.stderr.writelines(f"requirements.lock: {line}\n" for line in found)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
