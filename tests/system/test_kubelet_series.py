"""The kubelet patch series (kubelet/: KEP-4559's option 5 behind the CRIProbeDelegation gate) against its release.

`hack/build-kubelet-delegating.sh --source` writes k8s.io/kubernetes's own source (from the Go module cache, as the
module proxy serves it) with every patch applied exactly (`patch --fuzz=0`): a series that no longer applies to
kubelet/VERSION fails here first. Each patch carries its subject as `git format-patch` writes it. Without Go the
tests skip and say why; the first run downloads the module (about 30 MB). The series carries the Go stubs of the
ProbeService (patch 0002, in cri-api): they must be what hack/generate-go-probe-api.sh makes of today's protos.
The packages the series adds or changes pass their own `go test` (kubelet/TESTED), patched.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support.netns_env import REPO_ROOT

# A machine's first run downloads k8s.io/kubernetes and compiles the packages' tests and the protoc plugins.
pytestmark = pytest.mark.timeout(1200)

SERIES = REPO_ROOT / "kubelet"
BUILD = REPO_ROOT / "hack" / "build-kubelet-delegating.sh"


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    if shutil.which("go") is None:
        pytest.skip("needs Go (and the Go module proxy) for k8s.io/kubernetes's source")
    source = tmp_path_factory.mktemp("kubernetes")
    done = subprocess.run([str(BUILD), "--source", str(source)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return source


def test_every_patch_has_a_subject_and_touches_files():
    patches = sorted((SERIES / "patches").glob("*.patch"))
    assert patches and [p.name[:4] for p in patches] == [f"{n:04d}" for n in range(1, len(patches) + 1)]
    for patch in patches:
        text = patch.read_text()
        assert re.match(r"Subject: \[PATCH\] \S", text), patch.name
        assert "\ndiff --git a/" in text and "\n+++ b/" in text, patch.name


def test_the_series_applies_to_its_release_and_adds_the_gate_as_alpha(patched):
    features = (patched / "pkg" / "features" / "kube_features.go").read_text()
    assert 'CRIProbeDelegation featuregate.Feature = "CRIProbeDelegation"' in features
    spec = features[features.index("\tCRIProbeDelegation: {\n"):]
    assert spec.splitlines()[1].strip() == ('{Version: version.MustParse("1.37"), Default: false, '
                                            'PreRelease: featuregate.Alpha},')
    listed = (patched / "test" / "compatibility_lifecycle" / "reference" / "versioned_feature_list.yaml").read_text()
    assert "- name: CRIProbeDelegation\n" in listed
    assert (SERIES / "VERSION").read_text().strip() == "1.37.2"


def test_the_go_stubs_the_series_carries_are_generated_from_todays_protos(patched, tmp_path):
    done = subprocess.run([str(REPO_ROOT / "hack" / "generate-go-probe-api.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    carried = patched / "staging" / "src" / "k8s.io" / "cri-api" / "pkg" / "apis" / "runtime" / "probe" / "v1alpha1"
    fresh = sorted(p.name for p in tmp_path.glob("*.go"))
    assert fresh == ["probe_service.pb.go", "probe_service_grpc.pb.go", "probe_spec.pb.go"]
    for name in fresh:
        assert (carried / name).read_text() == (tmp_path / name).read_text(), (
            f"{name} drifted from cri_proto/: regenerate it into the series (kubelet/README.md says how)")


def test_the_patched_packages_pass_their_go_tests(patched):
    """`go test` of the packages the series adds or changes (kubelet/TESTED), the patched source as built."""
    done = subprocess.run([str(BUILD), "--test"], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    tested = [line for line in (SERIES / "TESTED").read_text().splitlines() if line and not line.startswith("#")]
    for package in tested:
        assert re.search(rf"^(ok|\?)\s+{re.escape(package)}\s", done.stdout, re.MULTILINE), (package, done.stdout)
