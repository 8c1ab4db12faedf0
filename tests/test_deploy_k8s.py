"""deploy/k8s: every overlay builds with `kubectl kustomize` (offline), every rendered
manifest validates against the OpenAPI schemas of a pinned Kubernetes version
(`kubernetes-validate` ships them), and the manifests agree with the code and the image:
ports, env vars, data directory, user, probes, lifecycle hooks. What they say is also run,
as processes, by tests/test_deploy_contract.py."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest

from tests.deploy_kit import (
    DEPLOY,
    OVERLAYS,
    env_of,
    env_vars,
    find,
    kubectl,
    parse_dockerfile,
    render,
    server_options,
)

K8S_VERSION = "1.33.0"  # pinned: the schemas the manifests are checked against
# read by the manifests themselves ($(VAR) expansion and the lifecycle hooks), not by squall
MANIFEST_VARS = {"POD_NAMESPACE", "POD_IP", "POD_NAME", "CLUSTER_DOMAIN", "MASTER_SCHEME",
                 "DECOMMISSION_ON_STOP", "DECOMMISSION_TIMEOUT_S"}
# the master set's options (master/cli.py): this member's name, the members, the elector
MASTER_SET_VARS = {"SQUALL_ADVERTISE", "SQUALL_MEMBERS", "SQUALL_ELECTOR"}
CLI_VARS = {"SQUALL_MASTER"}  # `squall nodes ...` in the hooks
# the production overlay serves TLS from the squall-tls Secret, with these files
TLS = {"SQUALL_TLS_CERT": "/etc/squall/tls/tls.crt", "SQUALL_TLS_KEY": "/etc/squall/tls/tls.key",
       "SQUALL_TLS_CA": "/etc/squall/tls/ca.crt"}
ROLES = {"squall-master": "master", "squall-data": "datanode"}

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl (with kustomize) is not "
                                "installed: cannot render deploy/k8s overlays")


def container(sts: dict[str, Any]) -> dict[str, Any]:
    [c] = sts["spec"]["template"]["spec"]["containers"]
    return c


def env_map(docs: tuple[dict[str, Any], ...], c: dict[str, Any]) -> dict[str, Any]:
    """Env of a container: envFrom ConfigMaps, then env entries (value or valueFrom)."""
    out: dict[str, Any] = {}
    for ref in c.get("envFrom", []):
        out.update(find(docs, "ConfigMap", ref["configMapRef"]["name"])["data"])
    for e in c.get("env", []):
        out[e["name"]] = e.get("value", e.get("valueFrom"))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds_and_validates(overlay: str) -> None:
    import kubernetes_validate

    docs = render(overlay)
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ConfigMap", "Namespace", "PodDisruptionBudget", "PodDisruptionBudget",
                "Role", "RoleBinding", "Service", "Service", "Service", "ServiceAccount",
                "StatefulSet", "StatefulSet"] + (["Secret"] * 2 if overlay == "dev" else [])
    assert kinds == sorted(expected)
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_sizes() -> None:
    dev, prod = render("dev"), render("production")
    assert find(dev, "StatefulSet", "squall-master")["spec"]["replicas"] == 1
    assert find(prod, "StatefulSet", "squall-master")["spec"]["replicas"] == 3
    assert find(dev, "StatefulSet", "squall-data")["spec"]["replicas"] == 3
    assert find(prod, "StatefulSet", "squall-data")["spec"]["replicas"] > 3
    prod_dn = find(prod, "StatefulSet", "squall-data")["spec"]["template"]["spec"]
    hard = prod_dn["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in hard] == ["kubernetes.io/hostname"]
    for c in (container(find(prod, "StatefulSet", n)) for n in ROLES):
        assert {"cpu", "memory"} <= set(c["resources"]["requests"])
        assert "memory" in c["resources"]["limits"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_match_the_code_and_image(overlay: str) -> None:
    docs = render(overlay)
    _, stages = parse_dockerfile(DEPLOY / "Dockerfile")
    image = stages[-1]
    uid = int(image.all("USER")[-1].split(":")[0])
    data_dir = env_of(image)["SQUALL_DATA_DIR"]
    opts = server_options()
    for name, role in ROLES.items():
        sts = find(docs, "StatefulSet", name)
        pod = sts["spec"]["template"]["spec"]
        c = container(sts)
        env = env_map(docs, c)
        assert "command" not in c, "the image's entrypoint (squall) runs"
        assert c["args"][0] == role
        # ports: the Service, the container and the server agree
        port = c["ports"][0]["containerPort"]
        assert c["ports"][0]["name"] == "http"
        assert int(env["SQUALL_PORT"]) == port == opts[role]["port"].default
        svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == name)
        assert svc["spec"]["ports"][0]["port"] == port
        assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
        # the governing Service: the data nodes', or the master set's members' (headless)
        assert sts["spec"]["serviceName"] == (name + "-members" if role == "master" else name)
        # env: SQUALL_* variables are the code's; the ones this role's own flags need are
        # set (both keys: a server bound beyond loopback refuses to start without them)
        assert {"SQUALL_PORT", "SQUALL_DATA_DIR", "SQUALL_CLUSTER_KEY_FILE",
                "SQUALL_AUTH_KEY_FILE", "SQUALL_ALLOWED_HOSTS"} <= set(env)
        assert "$(POD_IP)" in env["SQUALL_ALLOWED_HOSTS"]  # the Host of probes and scrapes
        assert "SQUALL_TOKEN" not in env  # never a long-lived credential in a pod's env
        for k in env:
            if k.startswith("SQUALL_"):  # one ConfigMap serves both roles
                known = env_vars("master") | env_vars("datanode") | CLI_VARS | MASTER_SET_VARS
                assert k in known, f"{k}: no squall server or CLI reads it"
            else:
                assert k in MANIFEST_VARS, k
        # data on the volume claim, at the image's data directory; /tmp writable
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert env["SQUALL_DATA_DIR"] == data_dir
        claim = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
        assert mounts[data_dir]["name"] == claim
        assert "/tmp" in mounts and not mounts["/tmp"].get("readOnly")
        volumes = {v["name"]: v for v in pod["volumes"]}
        for var, secret in (("SQUALL_CLUSTER_KEY_FILE", "squall-cluster-key"),
                            ("SQUALL_AUTH_KEY_FILE", "squall-auth-key"),
                            *((v, "squall-tls") for v in TLS if overlay == "production")):
            mount = next(p for p in mounts if env[var].startswith(p + "/"))
            ref = volumes[mounts[mount]["name"]]["secret"]
            # a generated Secret's name has a content hash appended (dev overlay)
            assert re.fullmatch(re.escape(secret) + r"(-[a-z0-9]{10})?", ref["secretName"]), var
            assert not ref.get("optional"), var
        # TLS in production, with the files of its Secret; probes speak it
        tls = overlay == "production"
        assert {k: env.get(k) for k in TLS} == (TLS if tls else dict.fromkeys(TLS))
        scheme = {"scheme": "HTTPS"} if tls else {}
        assert env["SQUALL_MASTER"] == f"{'https' if tls else 'http'}://squall-master:7070"
        # probes
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", **scheme}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", **scheme}
        assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http", **scheme}
        # security context: non-root as the image's user, read-only root, no escalation
        psc, csc = pod["securityContext"], c["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == uid == psc["fsGroup"]
        assert csc["readOnlyRootFilesystem"] is True
        assert csc["allowPrivilegeEscalation"] is False
        assert csc["capabilities"]["drop"] == ["ALL"]
        assert c["image"].split("/")[-1].startswith("squall:")


def test_data_node_identity_hooks_and_budget() -> None:
    for overlay in OVERLAYS:
        docs = render(overlay)
        sts = find(docs, "StatefulSet", "squall-data")
        pod = sts["spec"]["template"]["spec"]
        c = container(sts)
        env = env_map(docs, c)
        assert env["SQUALL_NODE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        svc = find(docs, "Service", "squall-data")
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["publishNotReadyAddresses"] is True
        scheme = "https" if overlay == "production" else "http"
        assert env["SQUALL_ADVERTISE"].startswith(
            f"{scheme}://$(SQUALL_NODE_ID).{svc['metadata']['name']}.$(POD_NAMESPACE).svc.")
        assert env["SQUALL_MASTER"].startswith(f"{scheme}://squall-master:")
        if overlay == "production":  # each node's own credential, by its pod name
            mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
            cred = env["SQUALL_NODE_CREDENTIAL_FILE"]
            assert cred.endswith("/$(SQUALL_NODE_ID)")
            vol = {v["name"]: v for v in pod["volumes"]}[mounts[cred.rsplit("/", 1)[0]]["name"]]
            assert vol["secret"]["secretName"] == "squall-node-credentials"
        keys = [t["podAffinityTerm"]["topologyKey"] for t in
                pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]]
        assert keys == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
        pdb = find(docs, "PodDisruptionBudget", "squall-data")
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre[:2] == ["sh", "-c"]
        words = shlex.split(pre[2])
        assert words[words.index("squall"):][:5] == ["squall", "nodes", "decommission",
                                                     "$SQUALL_NODE_ID", "--wait"]
        # both hooks call admin routes with a credential minted from the mounted auth key
        for hook in (pre[2], c["lifecycle"]["postStart"]["exec"]["command"][2]):
            assert 'squall auth mint --role admin' in hook
            assert '--key-file "$SQUALL_AUTH_KEY_FILE"' in hook and "export SQUALL_TOKEN" in hook
        # the grace period outlasts the decommission wait
        assert pod["terminationGracePeriodSeconds"] >= int(env["DECOMMISSION_TIMEOUT_S"]) + 30
        post = c["lifecycle"]["postStart"]["exec"]["command"]
        assert "--cancel" in post[2] and post[2].rstrip().endswith("exit 0")
        assert sts["spec"]["podManagementPolicy"] == "OrderedReady"


def members_of(env: dict[str, Any]) -> list[str]:
    return env["SQUALL_MEMBERS"].split(",")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_master_set(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Production: three members on distinct hosts, started together, replaced by hand,
    one voluntary disruption at a time, named by their stable DNS names, electing through
    one Lease their account may get, create and update; ready = leading. Dev: one master."""
    from squall.master.ha.elector import make_elector
    from squall.master.ha.kube import KubeLeaseElector

    docs = render(overlay)
    sts = find(docs, "StatefulSet", "squall-master")
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    c = container(sts)
    env = env_map(docs, c)
    labels = spec["selector"]["matchLabels"]
    assert spec["podManagementPolicy"] == "Parallel"  # a standby is never ready
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    # the members' headless Service publishes not-ready pods (standbys)
    members_svc = find(docs, "Service", "squall-master-members")
    assert spec["serviceName"] == members_svc["metadata"]["name"]
    assert members_svc["spec"]["clusterIP"] == "None"
    assert members_svc["spec"]["publishNotReadyAddresses"] is True
    assert members_svc["spec"]["selector"] == labels
    # clients' Service: ready pods only, i.e. the leader (readiness = /readyz)
    client_svc = next(d for d in docs if d["kind"] == "Service"
                      and d["metadata"]["name"] == "squall-master")
    assert not client_svc["spec"].get("publishNotReadyAddresses")
    assert client_svc["spec"].get("clusterIP") != "None"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    pdb = find(docs, "PodDisruptionBudget", "squall-master")
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"]["matchLabels"] == labels
    scheme = "https" if overlay == "production" else "http"
    assert env["MASTER_SCHEME"] == scheme and env["SQUALL_MASTER"].startswith(scheme + "://")
    name = "$(POD_NAME).squall-master-members.$(POD_NAMESPACE).svc.$(CLUSTER_DOMAIN)"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["SQUALL_ADVERTISE"] == f"$(MASTER_SCHEME)://{name}:7070"
    assert name in env["SQUALL_ALLOWED_HOSTS"].split(",")  # the other members' Host
    if overlay == "dev":
        assert spec["replicas"] == 1
        assert "SQUALL_MEMBERS" not in env and "SQUALL_ELECTOR" not in env
        assert "affinity" not in pod
        return
    n = spec["replicas"]
    assert n == 3
    pods = [f"{sts['metadata']['name']}-{i}" for i in range(n)]  # the StatefulSet's pods
    assert members_of(env) == [
        f"$(MASTER_SCHEME)://{name.replace('$(POD_NAME)', p)}:7070" for p in pods]
    hard = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [(t["topologyKey"], t["labelSelector"]["matchLabels"]) for t in hard] == [
        ("kubernetes.io/hostname", labels)]
    # the elector: the Lease the Role names, in the pod's namespace
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    elector = make_elector(env["SQUALL_ELECTOR"].replace("$(POD_NAMESPACE)", "squall"))
    assert isinstance(elector, KubeLeaseElector) and elector.namespace == "squall"
    # least privilege: get/update on that one Lease, create on leases; nothing else
    sa = find(docs, "ServiceAccount", "squall-master")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    role = find(docs, "Role", "squall-master")
    assert sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])),
                   tuple(r.get("resourceNames", ()))) for r in role["rules"]) == [
        (("coordination.k8s.io",), ("leases",), ("create",), ()),
        (("coordination.k8s.io",), ("leases",), ("get", "update"), (elector.name,))]
    binding = find(docs, "RoleBinding", "squall-master")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sts["metadata"]["namespace"]}]
    assert not any(d["kind"].startswith("Cluster") for d in docs)


def test_master_set_vars_are_the_masters() -> None:
    """SQUALL_MEMBERS and SQUALL_ELECTOR are read by `squall master` (its set options)."""
    opts = server_options()["master"]
    if not any(str(o.envvar) == "SQUALL_MEMBERS" for o in opts.values()):
        pytest.skip("this build's `squall master` has no master-set options yet")
    assert env_vars("master") >= MASTER_SET_VARS
