"""What importing a module pulls in, measured in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.netns_env import REPO_ROOT


def import_report(module: str) -> tuple[set[str], int]:
    """Top-level packages in sys.modules and the thread count after `import module`."""
    code = (
        "import json, sys, threading\n"
        f"import {module}\n"
        "print(json.dumps({'modules': sorted({m.split('.')[0] for m in sys.modules}),"
        " 'threads': threading.active_count()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, capture_output=True, text=True)
    report = json.loads(out.stdout)
    return set(report["modules"]), report["threads"]
