"""A contract test that runs what the manifests say.

The dev overlay is rendered with `kubectl kustomize`; every pod of its StatefulSets is
started as a local process exactly as the kubelet would start it: the image's ENTRYPOINT
(parsed from deploy/Dockerfile) plus the container's args, the image's ENV, then envFrom
and env (fieldRefs, ConfigMap and Secret keys, `$(VAR)` expansion), the Secret volumes as
files. Then: every pod's probes answer as the manifests expect, the data nodes join the
master under their pod names and advertised DNS names, put -> lease -> done works end to
end, and one data node's `preStop` command (run as written, through `sh -c`) decommissions
it with every payload still at its replication factor on the other nodes; its `postStart`
brings it back into service after a restart.

The one change from a cluster is :func:`localize`, applied to every env value and arg:
- network: a pod's address (any DNS name of the pod or of its Service, with the container
  port) becomes ``127.0.0.1:<a local port of that pod>``, and the pod's own listen address
  (``SQUALL_HOST`` 0.0.0.0 = all its interfaces, ``SQUALL_PORT`` = its containerPort)
  becomes that same local address; probes go to it;
- files: a volume's mountPath becomes a folder of this test (PersistentVolumeClaim and
  emptyDir: empty folders; Secret: its keys as files).
Nothing else is changed; `squall` is found on PATH as in the image.
"""

from __future__ import annotations

import base64
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from squall.client import Client
from squall.common.security import auth, tokens
from squall.common.wire.payload import OK
from tests.blobhttp import get_batch
from tests.deploy_kit import DEPLOY, env_of, find, kubectl, parse_dockerfile, render
from tests.helpers import free_port_block, wait_for

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl (with kustomize) is not "
                                "installed: cannot render deploy/k8s overlays")
VAR = re.compile(r"\$\((\w+)\)|\$\$")
HOSTPORT = re.compile(r"(?<![\w.-])([a-z0-9][a-z0-9.-]*):(\d+)")


@dataclass
class Pod:
    name: str
    sts: dict[str, Any]
    port: int  # its local port: stands for <pod IP>:<containerPort>
    root: Path
    mounts: dict[str, Path] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def container(self) -> dict[str, Any]:
        [c] = self.sts["spec"]["template"]["spec"]["containers"]
        return c

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def container_port(self) -> int:
        return int(self.container["ports"][0]["containerPort"])


class Deployment:
    """The dev overlay's pods as local processes."""

    def __init__(self, tmp: Path, overlay: str = "dev") -> None:
        self.docs = render(overlay)
        _, stages = parse_dockerfile(DEPLOY / "Dockerfile")
        image = stages[-1]
        self.entrypoint = shlex.split(image.all("ENTRYPOINT")[-1].strip("[]").replace(",", " "))
        self.image_env = env_of(image)
        sets = [d for d in self.docs if d["kind"] == "StatefulSet"]
        self.namespace = sets[0]["metadata"]["namespace"]
        names = [(s, f"{s['metadata']['name']}-{i}") for s in sets
                 for i in range(s["spec"]["replicas"])]
        base = free_port_block(len(names))
        self.pods = {n: Pod(n, s, base + i, tmp / n) for i, (s, n) in enumerate(names)}
        self.endpoints = self._endpoints()
        self.closing: list[httpx.Client] = []
        for pod in self.pods.values():
            self._prepare(pod)

    # -- the one substitution ------------------------------------------------------------
    def _endpoints(self) -> dict[tuple[str, int], int]:
        """(DNS name, port) -> local port, for every pod and Service name a client may use."""
        out: dict[tuple[str, int], int] = {}
        domain = "cluster.local"
        for pod in self.pods.values():
            labels = pod.sts["spec"]["template"]["metadata"]["labels"]
            governing = pod.sts["spec"]["serviceName"]
            for svc in (d for d in self.docs if d["kind"] == "Service"):
                if not svc["spec"]["selector"].items() <= labels.items():
                    continue  # not one of this pod's Services
                sname, ns = svc["metadata"]["name"], self.namespace
                for p in svc["spec"]["ports"]:
                    port = int(p["port"])
                    hosts = []
                    if sname == governing:  # the pod's own stable names
                        hosts += [f"{pod.name}.{sname}", f"{pod.name}.{sname}.{ns}",
                                  f"{pod.name}.{sname}.{ns}.svc",
                                  f"{pod.name}.{sname}.{ns}.svc.{domain}"]
                    if svc["spec"].get("clusterIP") != "None" or pod.name.endswith("-0"):
                        # a Service name reaches one of its ready pods (here: a one-replica
                        # set's; for the master's, the leader: dev runs one master)
                        hosts += [sname, f"{sname}.{ns}", f"{sname}.{ns}.svc",
                                  f"{sname}.{ns}.svc.{domain}"]
                    for h in hosts:
                        out[(h, port)] = pod.port
        return out

    def localize(self, pod: Pod, key: str, value: str) -> str:
        """The documented substitution (see the module docstring); nothing else changes."""
        if key == "SQUALL_HOST" and value == "0.0.0.0":
            return "127.0.0.1"
        if key == "SQUALL_PORT" and value == str(pod.container_port):
            return str(pod.port)

        def endpoint(m: re.Match[str]) -> str:
            local = self.endpoints.get((m.group(1), int(m.group(2))))
            return f"127.0.0.1:{local}" if local else m.group(0)

        value = HOSTPORT.sub(endpoint, value)
        for mount, local in sorted(pod.mounts.items(), key=lambda x: -len(x[0])):
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount):]  # the longest mountPath wins
        return value

    # -- what the kubelet does -----------------------------------------------------------
    def _prepare(self, pod: Pod) -> None:
        spec = pod.sts["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in pod.sts["spec"].get("volumeClaimTemplates", [])}
        for m in pod.container["volumeMounts"]:
            local = pod.root / "volumes" / m["name"]
            local.mkdir(parents=True, exist_ok=True)
            v = volumes.get(m["name"])
            if v is not None and "secret" in v:
                secret = find(self.docs, "Secret", v["secret"]["secretName"])
                for k, b64 in secret.get("data", {}).items():
                    (local / k).write_bytes(base64.b64decode(b64))
            else:
                assert m["name"] in claims or (v is not None and "emptyDir" in v), m
            pod.mounts[m["mountPath"]] = local
        env = dict(self.image_env)
        c = pod.container
        for ref in c.get("envFrom", []):
            env.update(find(self.docs, "ConfigMap", ref["configMapRef"]["name"])["data"])
        for e in c.get("env", []):
            env[e["name"]] = self._value(pod, e, env)
        pod.env = {k: self.localize(pod, k, v) for k, v in env.items()}
        args = [_expand(a, env) for a in c.get("command", self.entrypoint) + c.get("args", [])]
        pod.argv = [self.localize(pod, "", a) for a in args]

    def _value(self, pod: Pod, e: dict[str, Any], env: dict[str, str]) -> str:
        if "value" in e:
            return _expand(e["value"], env)
        src = e["valueFrom"]
        if "fieldRef" in src:
            return {"metadata.name": pod.name, "metadata.namespace": self.namespace,
                    "status.podIP": "127.0.0.1"}[src["fieldRef"]["fieldPath"]]
        if "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            return str(find(self.docs, "ConfigMap", ref["name"])["data"][ref["key"]])
        ref = src["secretKeyRef"]
        return base64.b64decode(find(self.docs, "Secret", ref["name"])["data"][ref["key"]]
                                ).decode()

    def process_env(self, pod: Pod) -> dict[str, str]:
        """The container's environment; `squall` and `sh` on PATH as in the image."""
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        return {"PATH": path, "HOME": str(pod.root), **pod.env}

    def start(self, pod: Pod) -> None:
        exe = [str(Path(sys.executable).parent / pod.argv[0]), *pod.argv[1:]]
        log = open(pod.root / "container.log", "ab")  # noqa: SIM115 - the child owns it
        pod.proc = subprocess.Popen(exe, env=self.process_env(pod), stdout=log,
                                    stderr=subprocess.STDOUT, cwd=pod.root)
        log.close()

    def hook(self, pod: Pod, which: str, timeout: float) -> subprocess.CompletedProcess[str]:
        cmd = pod.container["lifecycle"][which]["exec"]["command"]
        return subprocess.run(cmd, env=self.process_env(pod), capture_output=True, text=True,
                              timeout=timeout, cwd=pod.root)

    def hook_async(self, pod: Pod, which: str) -> subprocess.Popen[str]:
        cmd = pod.container["lifecycle"][which]["exec"]["command"]
        return subprocess.Popen(cmd, env=self.process_env(pod), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=pod.root)

    def probe(self, pod: Pod, kind: str) -> bool:
        if pod.proc is not None and pod.proc.poll() is not None:
            raise AssertionError(f"{pod.name} exited with {pod.proc.returncode}")
        get = pod.container[kind]["httpGet"]
        port = get["port"]
        assert port in ("http", pod.container_port), port  # the containerPort: this pod's
        try:
            r = httpx.get(pod.url + get["path"], timeout=float(
                pod.container[kind].get("timeoutSeconds", 1)))
        except httpx.TransportError:
            return False
        return 200 <= r.status_code < 400  # the kubelet's success range

    def stop(self, pod: Pod) -> None:
        if pod.proc is not None and pod.proc.poll() is None:
            pod.proc.send_signal(signal.SIGTERM)
            try:
                pod.proc.wait(20)
            except subprocess.TimeoutExpired:
                pod.proc.kill()
                pod.proc.wait(10)

    def logs(self) -> str:
        out = []
        for p in self.pods.values():
            f = p.root / "container.log"
            if f.exists():
                out.append(f"--- {p.name}\n" + f.read_text(errors="replace")[-3000:])
        return "\n".join(out)


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables only; $$ is a literal $."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return VAR.sub(sub, value)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(tmp_path)
    try:
        yield d
    finally:
        for h in d.closing:
            h.close()
        for p in reversed(list(d.pods.values())):
            d.stop(p)
        sys.stderr.write(d.logs())  # shown by pytest when the test failed


def start_set(d: Deployment, prefix: str) -> list[Pod]:
    """Start a StatefulSet's pods, each with its postStart hook alongside (as the kubelet
    does), then wait for their startup and readiness probes. The pods start together, not
    one by one as OrderedReady would: the order is the controller's business, and starting
    them at once keeps this test short on a busy machine."""
    pods = [p for p in d.pods.values() if p.name.startswith(prefix + "-")]
    hooks = []
    for p in pods:
        d.start(p)
        if "postStart" in p.container.get("lifecycle", {}):
            hooks.append(d.hook_async(p, "postStart"))
    for h in hooks:
        out, _ = h.communicate(timeout=120)
        assert h.returncode == 0, out
    for p in pods:
        probe_until(d, p, "startupProbe")
        probe_until(d, p, "readinessProbe")
    return pods


def start_pod(d: Deployment, p: Pod) -> None:
    """Start one pod's container and its postStart hook; the probes begin after the hook."""
    d.start(p)
    if "postStart" in p.container.get("lifecycle", {}):
        r = d.hook(p, "postStart", 120)
        assert r.returncode == 0, r


def probe_until(d: Deployment, p: Pod, kind: str, timeout: float = 120.0) -> None:
    """Probe like the kubelet until it succeeds; fail at once if the container exited."""
    wait_for(lambda: d.probe(p, kind), timeout, interval=0.1, what=f"{p.name}: {kind}",
             fatal=AssertionError)


def test_the_dev_overlay_runs_as_written(deployment: Deployment) -> None:
    d = deployment
    [master] = start_set(d, "squall-master")
    nodes = start_set(d, "squall-data")
    assert len(nodes) == 3
    for p in (master, *nodes):
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert d.probe(p, kind), (p.name, kind)

    # an operator's admin credential, minted from the overlay's auth key Secret
    auth_key = (master.mounts["/etc/squall/auth-key"] / "auth-key").read_bytes()
    admin = auth.mint(auth.parse_keys(auth_key)[0], ["admin"], 3600, time.time())
    http = httpx.Client(base_url=master.url, timeout=30,
                        headers={"Authorization": f"Bearer {admin}"})
    d.closing.append(http)
    assert httpx.get(master.url + "/v1/cluster", timeout=30).status_code == 401

    def joined() -> dict[str, Any]:
        info = http.get("/v1/cluster").json()
        return {n["node_id"]: n for n in info["nodes"] if n["state"] == "alive"}

    table = wait_for(lambda: len(joined()) == 3 and joined(), 30, 0.1, "data nodes joined")
    for p in nodes:  # node id = pod name; address = its pod DNS name (here: its local port)
        assert table[p.name]["address"] == p.env["SQUALL_ADVERTISE"] == p.url

    with Client(master.url, token=admin) as c:
        c.put("contract#q", b"hello from the manifests", pid="!first")  # sorts first
        c.put_many("contract#q", [f"payload {i}".encode() * 50 for i in range(40)])
        [t] = c.lease("contract#q", 1, lease_secs=60)
        assert t.pid == "!first" and t.payload() == b"hello from the manifests"
        t.done()
        blobs = {}
        for info in c.iter_tasks("contract#q"):
            assert info.payload is not None
            blobs[info.payload.blob_id] = info.pid
    assert len(blobs) == 40

    # scale-down / upgrade of the highest ordinal: its preStop, exactly as written
    victim, others = nodes[-1], nodes[:-1]
    wait_for(lambda: http.get(f"/v1/nodes/{victim.name}").json()["blob_count"] > 0, 30, 0.1,
             f"{victim.name} reports blobs")
    r = d.hook(victim, "preStop", 180)
    assert r.returncode == 0, r
    state = http.get(f"/v1/nodes/{victim.name}").json()
    assert state["state"] == "decommissioned", state
    assert state["decommission"]["blobs_remaining"] == 0
    key = (master.mounts["/etc/squall/cluster-key"] / "cluster-key").read_bytes()
    ids = sorted(blobs)
    toks = [tokens.sign(key, "read", [b], time.time() + 300) for b in ids]
    with httpx.Client(timeout=30) as h:
        held = {b: 0 for b in ids}
        for p in others:
            for b, f in get_batch(h, p.url, ids, toks).items():
                held[b] += f.status == OK
    assert min(held.values()) >= 2, held  # RF 2 on the nodes that stay

    # the kubelet stops it; a restarted pod (rolling upgrade) comes back via its postStart
    d.stop(victim)
    start_pod(d, victim)
    probe_until(d, victim, "readinessProbe")
    back = wait_for(lambda: (s := http.get(f"/v1/nodes/{victim.name}").json())["state"]
                    == "alive" and s, 30, 0.1, "node back in service")
    assert back["decommission"] is None
