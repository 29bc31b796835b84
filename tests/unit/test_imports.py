"""Every envace module imports on its own, whatever was imported before (no import cycle bites a first import).

Checked in a child process: each module is imported after every envace module was dropped from ``sys.modules``,
which this test process must not do to itself (later tests would mix two copies of the same classes).
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import importlib, pkgutil, sys, traceback
import envace
names = sorted(m.name for m in pkgutil.walk_packages(envace.__path__, "envace.") if not m.name.endswith("__main__"))
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "envace" or m.startswith("envace.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ": " + traceback.format_exc().strip().splitlines()[-1])
print(len(names))
print("\\n".join(failed))
"""


def test_every_module_imports_first() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    count, *failed = out.stdout.strip().splitlines()
    assert int(count) > 50  # the whole package was walked
    assert [f for f in failed if f] == []
