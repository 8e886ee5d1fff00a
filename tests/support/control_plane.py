"""A one-machine Kubernetes control plane for the tests and the benchmark: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, all on 127.0.0.1 in a private directory, as hack/local-up-cluster.sh in
k8s.io/kubernetes starts them (its admission plugins, Node and RBAC authorization, client certificates).

Owns: finding the binaries (the cache of hack/build-kubernetes.sh for K8S_VERSION and of hack/build-etcd.sh for
ETCD_VERSION; `unavailable_reason()` says what is missing); the cluster's certificates (`ClusterPki`: one CA for
serving and client certificates, the service-account key); kubeconfigs per identity; starting each component and
waiting until it answers; `kubectl` as a user runs it; a small JSON client of the API (`ApiClient`) for what
kubectl has no verb for (a Node's status, a Lease); and a stop that ends every process it started.

Free of pytest (the benchmark imports it). The kubelet is tests/support/kubelet_env.py's, given a kubeconfig.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.kubelet_env import free_ports, kubernetes_build_dir

DEFAULT_ETCD_VERSION = "3.7.0"   # what Kubernetes 1.37 is built and tested with (its build/dependencies.yaml)
SERVICE_CIDR = "10.0.0.0/24"     # never routed: no kube-proxy runs, nothing in the tests calls a Service's IP
START_TIMEOUT_S = 90.0           # the API server's first start migrates its storage and bootstraps RBAC
STOP_TIMEOUT_S = 20.0
POLL_S = 0.2
KUBECTL_TIMEOUT_S = 60.0
# hack/local-up-cluster.sh's admission plugins: a real cluster's, with the webhooks and NodeRestriction.
ADMISSION_PLUGINS = ("NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,DefaultTolerationSeconds,"
                     "Priority,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota,NodeRestriction")
CONTROL_PLANE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


def etcd_dir() -> Path:
    version = os.environ.get("ETCD_VERSION") or DEFAULT_ETCD_VERSION
    cache = os.environ.get("ETCD_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cri-probe-shim" / "etcd"
    return Path(cache) / f"v{version}"


def binary(name: str) -> Path:
    return etcd_dir() / name if name == "etcd" else kubernetes_build_dir() / name


def unavailable_reason() -> str | None:
    """Why the control plane cannot run here, or None (the kubelet's own reasons are kubelet_env's)."""
    missing = [str(binary(name)) for name in ("etcd", *CONTROL_PLANE_BINARIES) if not os.access(binary(name), os.X_OK)]
    if missing:
        return (f"needs the control plane's binaries, not built: {', '.join(missing)}; `make control-plane` builds "
                "them (Go and the Go module proxy)")
    return None


# --- certificates ------------------------------------------------------------------------------------------------

def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class ClusterPki:
    """A CA (ECDSA P-256) that signs every serving and client certificate of the cluster, and the key that signs
    service-account tokens; files in `directory`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self._now = datetime.datetime.now(datetime.timezone.utc)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "probe-shim test cluster CA")])
        ca = (self._builder(self._name, self._key.public_key())
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
              .sign(self._key, hashes.SHA256()))
        self.ca_cert = directory / "ca.crt"
        self.ca_key = directory / "ca.key"
        self.ca_cert.write_bytes(_pem(ca))
        self.ca_key.write_bytes(_key_pem(self._key))
        # The signing key as the API server reads it (SEC 1), and its public half for verifying tokens.
        signing = ec.generate_private_key(ec.SECP256R1())
        self.service_account_key = directory / "service-account.key"
        self.service_account_key.write_bytes(signing.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
        self.service_account_public_key = directory / "service-account.pub"
        self.service_account_public_key.write_bytes(signing.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def _builder(self, subject: x509.Name, public_key) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(self._name).public_key(public_key)
                .serial_number(x509.random_serial_number())
                .not_valid_before(self._now - datetime.timedelta(minutes=5))
                .not_valid_after(self._now + datetime.timedelta(days=1)))

    def issue(self, name: str, common_name: str, *, organizations: Sequence[str] = (), ips: Sequence[str] = (),
              dns: Sequence[str] = ()) -> tuple[Path, Path]:
        """A certificate for both serving (when given names) and client use: (cert, key) paths. The API server
        reads a client's user from the CN and its groups from O, as every Kubernetes authenticator of x509 does."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
                            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if ips or dns else [])
        builder = (self._builder(subject, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if ips or dns:
            names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + [x509.DNSName(d) for d in dns]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert_path, key_path = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        cert_path.write_bytes(_pem(builder.sign(self._key, hashes.SHA256())))
        key_path.write_bytes(_key_pem(key))
        key_path.chmod(0o600)
        return cert_path, key_path


def kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
    }, sort_keys=False))
    return path


# --- the API, for what kubectl has no verb for -------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


@dataclass
class ApiClient:
    """JSON over HTTPS to the API server as one client certificate's user."""

    port: int
    ca: Path
    cert: Path
    key: Path
    _context: ssl.SSLContext | None = None

    def _ssl(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = ssl.create_default_context(cafile=str(self.ca))
            self._context.load_cert_chain(str(self.cert), str(self.key))
        return self._context

    def _exchange(self, method: str, path: str, body: str | None = None,
                  content_type: str = "application/json", timeout_s: float = 30.0) -> str:
        """One request on a connection of its own; the answer's body, or ApiError for a status of 300 or more."""
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self._ssl(), timeout=timeout_s)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": content_type, "Accept": "application/json"})
            answer = conn.getresponse()
            data = answer.read().decode(errors="replace")
        finally:
            conn.close()
        if answer.status >= 300:
            raise ApiError(answer.status, data)
        return data

    def request(self, method: str, path: str, body: dict | None = None,
                content_type: str = "application/json", timeout_s: float = 30.0) -> dict:
        data = self._exchange(method, path, None if body is None else json.dumps(body), content_type, timeout_s)
        return json.loads(data) if data.startswith("{") else {"text": data}

    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def text(self, path: str) -> str:
        return self._exchange("GET", path)


# --- the processes -----------------------------------------------------------------------------------------------

@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    # Ended by the SIGTERM (etcd raises it again once it has cleaned up); kube-scheduler without leader election
    # ends one with "finished without leader elect" and exit 1.
    clean_exits: tuple[int, ...] = (0, -signal.SIGTERM)

    def start(self) -> "Component":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@dataclass
class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler in `workdir`; `start()` returns once the API
    server is ready, the controllers and the scheduler are healthy and the default namespace's service account
    exists (pods can be created)."""

    workdir: Path
    components: list[Component] = field(default_factory=list)
    pki: ClusterPki | None = None
    api_port: int = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def kubeconfig_path(self, user: str) -> Path:
        return self.workdir / "kubeconfigs" / f"{user}.kubeconfig"

    def client_kubeconfig(self, user: str, common_name: str, organizations: Sequence[str] = ()) -> Path:
        """A kubeconfig for `common_name` (in groups `organizations`), its certificate signed by the cluster CA."""
        cert, key = self.pki.issue(f"client-{user}", common_name, organizations=organizations)
        return kubeconfig(self.kubeconfig_path(user), self.server, self.pki.ca_cert, cert, key, user)

    def api(self) -> ApiClient:
        return ApiClient(self.api_port, self.pki.ca_cert, self.pki.dir / "client-admin.crt",
                         self.pki.dir / "client-admin.key")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout_s: float = KUBECTL_TIMEOUT_S) -> subprocess.CompletedProcess:
        """kubectl as the cluster's admin (system:masters), as a user runs it."""
        # Its discovery cache in the cluster's directory, not ~/.kube/cache.
        done = subprocess.run([str(binary("kubectl")), f"--kubeconfig={self.kubeconfig_path('admin')}",
                               f"--cache-dir={self.workdir / 'kubectl-cache'}", *args],
                              input=input, capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def get_json(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    # --- start ---

    def start(self) -> "ControlPlane":
        for sub in ("pki", "kubeconfigs", "etcd", "apiserver", "controller-manager", "scheduler", "logs"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.pki = ClusterPki(self.workdir / "pki")
        etcd_client, etcd_peer, self.api_port, cm_port, scheduler_port = free_ports(5)
        serving = self.pki.issue("serving-kube-apiserver", "kube-apiserver", ips=("127.0.0.1", "10.0.0.1"),
                                 dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                      "kubernetes.default.svc.cluster.local"))
        kubelet_client = self.pki.issue("client-kube-apiserver", "kube-apiserver-kubelet-client",
                                        organizations=("system:masters",))
        self.client_kubeconfig("admin", "admin", ("system:masters",))
        controller = self.client_kubeconfig("controller-manager", "system:kube-controller-manager")
        scheduler = self.client_kubeconfig("scheduler", "system:kube-scheduler")

        self._run("etcd", [
            str(binary("etcd")), "--name=test", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=test=http://127.0.0.1:{etcd_peer}",
            # A test cluster's data is thrown away: no fsync (etcd's own flag for tests).
            "--unsafe-no-fsync", "--log-level=warn"])
        self._until("etcd healthy", lambda: _answers_200(f"http://127.0.0.1:{etcd_client}/health"), "etcd")

        self._run("kube-apiserver", [
            str(binary("kube-apiserver")), f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            "--bind-address=127.0.0.1", f"--secure-port={self.api_port}", "--advertise-address=127.0.0.1",
            # The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints refuse: nothing in the
            # tests calls it (pods never reach the API server here).
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver'}",
            f"--tls-cert-file={serving[0]}", f"--tls-private-key-file={serving[1]}",
            f"--client-ca-file={self.pki.ca_cert}",
            f"--kubelet-client-certificate={kubelet_client[0]}", f"--kubelet-client-key={kubelet_client[1]}",
            f"--service-account-key-file={self.pki.service_account_public_key}",
            f"--service-account-signing-key-file={self.pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", f"--enable-admission-plugins={ADMISSION_PLUGINS}",
            "--profiling=false", "--v=1"])
        api = self.api()
        self._until("the API server ready", lambda: _api_ok(api, "/readyz"), "kube-apiserver")

        self._run("kube-controller-manager", [
            str(binary("kube-controller-manager")), f"--kubeconfig={controller}",
            f"--authentication-kubeconfig={controller}", f"--authorization-kubeconfig={controller}",
            f"--service-account-private-key-file={self.pki.service_account_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--cluster-signing-cert-file={self.pki.ca_cert}", f"--cluster-signing-key-file={self.pki.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--use-service-account-credentials",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={cm_port}",
            f"--cert-dir={self.workdir / 'controller-manager'}", "--profiling=false", "--v=1"])
        config = self.workdir / "scheduler" / "config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(scheduler)}, "leaderElection": {"leaderElect": False}}))
        self._run("kube-scheduler", [
            str(binary("kube-scheduler")), f"--config={config}", f"--authentication-kubeconfig={scheduler}",
            f"--authorization-kubeconfig={scheduler}", "--bind-address=127.0.0.1", f"--secure-port={scheduler_port}",
            f"--cert-dir={self.workdir / 'scheduler'}", "--v=1"], clean_exits=(0, 1, -signal.SIGTERM))
        for name, port in (("kube-controller-manager", cm_port), ("kube-scheduler", scheduler_port)):
            self._until(f"{name} healthy", lambda p=port: _https_ok(f"https://127.0.0.1:{p}/healthz"), name)
        # The service-account controller makes each namespace's `default` account; pods wait for it.
        self._until("the default service account", lambda: _api_ok(
            api, "/api/v1/namespaces/default/serviceaccounts/default"), "kube-controller-manager")
        return self

    def _run(self, name: str, argv: list[str], clean_exits: tuple[int, ...] = (0, -signal.SIGTERM)) -> Component:
        component = Component(name, argv, self.workdir / "logs" / f"{name}.log", clean_exits=clean_exits).start()
        self.components.append(component)
        return component

    def component(self, name: str) -> Component:
        return next(c for c in self.components if c.name == name)

    def _until(self, what: str, check, name: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            dead = [c for c in self.components if not c.alive()]
            if dead or time.monotonic() > deadline:
                culprit = dead[0] if dead else self.component(name)
                raise RuntimeError(f"no {what} within {timeout_s:g}s ({culprit.name} "
                                   f"{'exited ' + str(culprit.proc.returncode) if dead else 'running'}):\n"
                                   f"{culprit.log_tail()}")
            time.sleep(POLL_S)  # a port that starts answering has no event to wait on

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(f"--- {c.name} ---\n{c.log_tail(lines)}" for c in self.components)

    def stop(self) -> list[str]:
        """Stops every component, newest first; returns those that did not exit 0 on SIGTERM (with their code)."""
        unclean = []
        for component in reversed(self.components):
            code = component.stop()
            if code is not None and code not in component.clean_exits:
                unclean.append(f"{component.name} exited {code}")
        return unclean


def _answers_200(url: str, context: ssl.SSLContext | None = None) -> bool:
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:
            return answer.status == 200
    return False


def _https_ok(url: str) -> bool:
    """A component's own /healthz (self-signed serving certificate, path open to anyone by default)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return _answers_200(url, context)


def _api_ok(api: ApiClient, path: str) -> bool:
    with contextlib.suppress(OSError, ApiError, ssl.SSLError):
        api.text(path)
        return True
    return False
