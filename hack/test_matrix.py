"""The real-kubelet tests against every supported kubelet release, each on the containerd releases it supports.

    .venv/bin/python hack/test_matrix.py [--containerd 2.4.2] [--kubelets 1.35.4,1.36.3,1.37.2] [--out FILE]
                                         [PYTEST_ARGS...]

`make test-matrix` runs it. For each kubelet it builds what is missing (hack/build-kubernetes.sh: kubelet and
crictl, into the cache the tests read), then runs the real-kubelet tests (tests/e2e/test_real_kubelet*.py) once per runtime the pair
supports (Kubernetes 1.35 is the last release that supports containerd 1.x: 1.35 runs on Debian's 1.6 and on
2.x, 1.36 and 1.37 on 2.x only), and prints one Markdown table, test x (kubelet, containerd), the one docs/versions.md
shows. Exits 1 when any cell failed or errored.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.containerd_session import DEBIAN_CONTAINERD, DEFAULT_CONTAINERD, Runtime  # noqa: E402

KUBELETS = ("1.35.4", "1.36.3", "1.37.2")
TESTS = ("tests/e2e/test_real_kubelet.py", "tests/e2e/test_real_kubelet_answers.py")
MARKS = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "skipped": "skip"}


def pairs(kubelets: list[str], containerd: str) -> list[tuple[str, Runtime]]:
    """Each kubelet with every runtime that supports it: Debian's 1.6 first where it can, then the 2.x."""
    out = []
    for kubelet in kubelets:
        minor = int(kubelet.split(".")[1])
        out += [(kubelet, runtime) for runtime in (Runtime(DEBIAN_CONTAINERD), Runtime(containerd))
                if runtime.supports_kubelet(minor)]
    return out


def outcomes(junit: Path) -> dict[str, str]:
    """test name (without its parameter id) -> passed, failed, error or skipped, from pytest's JUnit XML."""
    result = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        name = case.get("name", "").split("[")[0]
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result[name] = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(kinds[0], "") \
            if kinds else "passed"
    return result


def table(columns: list[str], cells: dict[str, dict[str, str]]) -> str:
    tests = sorted({name for column in cells.values() for name in column})
    lines = ["| test | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for name in tests:
        marks = [MARKS.get(cells[column].get(name, ""), "-") for column in columns]
        lines.append(f"| `{name.removeprefix('test_')}` | " + " | ".join(marks) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containerd", default=os.environ.get("CONTAINERD_VERSION") or DEFAULT_CONTAINERD)
    parser.add_argument("--kubelets", default=",".join(KUBELETS))
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) here")
    args, pytest_args = parser.parse_known_args(argv)
    columns, cells, seconds = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="test-matrix-") as tmp:
        for kubelet, runtime in pairs(args.kubelets.split(","), args.containerd):
            subprocess.run([str(REPO / "hack" / "build-kubernetes.sh"), kubelet, "kubelet", "crictl"], check=True,
                           stdout=subprocess.DEVNULL)
            column = f"{kubelet} / {runtime.version}"
            junit = Path(tmp) / f"{kubelet}-{runtime.version}.xml"
            env = dict(os.environ, K8S_VERSION=kubelet, CONTAINERD_VERSIONS=runtime.version)
            env.pop("KUBELET_BIN", None)
            env.pop("CRICTL_BIN", None)
            print(f"== kubelet {kubelet} on containerd {runtime.version}", flush=True)
            started = time.monotonic()
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider",
                            f"--junitxml={junit}", *TESTS, *pytest_args], cwd=REPO, env=env)
            seconds[column] = time.monotonic() - started
            columns.append(column)
            cells[column] = outcomes(junit) if junit.exists() else {}
    text = table(columns, cells) + "\n\nkubelet / containerd, seconds: " + ", ".join(
        f"{column} {seconds[column]:.0f} s" for column in columns) + "\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(text)
    bad = [c for c in columns if not cells[c] or any(v in ("failed", "error") for v in cells[c].values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
