"""deploy/k8s/examples/keda-sqs: the KEDA example renders with `kubectl kustomize`, its
Kubernetes objects validate against the pinned schemas, and its KEDA objects (whose CRDs
kubernetes-validate does not know) use the kinds, apiVersion and trigger fields KEDA
documents for its aws-sqs-queue scaler, pointing at the data nodes' SQS endpoint."""

from __future__ import annotations

import subprocess
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy_kit import K8S, find, kubectl, render
from tests.test_deploy_k8s import K8S_VERSION, env_map

pytestmark = pytest.mark.skipif(kubectl() is None, reason="kubectl (with kustomize) is not "
                                "installed: cannot render deploy/k8s examples")
EXAMPLE = K8S / "examples" / "keda-sqs"
# KEDA's aws-sqs-queue scaler: its trigger metadata keys and its auth parameters
# (keda.sh/docs/latest/scalers/aws-sqs), of which the example must use only these
SQS_METADATA = {"queueURL", "queueURLFromEnv", "queueLength", "activationQueueLength",
                "awsRegion", "awsEndpoint", "scaleOnInFlight", "scaleOnDelayed",
                "identityOwner"}
AUTH_PARAMS = {"awsAccessKeyID", "awsSecretAccessKey", "awsSessionToken", "awsRoleArn"}


def _docs() -> tuple[dict[str, Any], ...]:
    exe = kubectl()
    assert exe is not None
    r = subprocess.run([exe, "kustomize", str(EXAMPLE)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"kubectl kustomize failed:\n{r.stderr}"
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def test_keda_example_renders_and_names_what_keda_reads() -> None:
    import kubernetes_validate

    docs = _docs()
    assert sorted((d["apiVersion"], d["kind"]) for d in docs) == sorted([
        ("v1", "ConfigMap"), ("v1", "Secret"), ("apps/v1", "Deployment"),
        ("keda.sh/v1alpha1", "TriggerAuthentication"), ("keda.sh/v1alpha1", "ScaledObject")])
    for d in docs:
        if not d["apiVersion"].startswith("keda.sh/"):
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    so = find(docs, "ScaledObject")
    deploy = find(docs, "Deployment")
    auth = find(docs, "TriggerAuthentication")
    secret = find(docs, "Secret")
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                            "name": deploy["metadata"]["name"]}
    [trigger] = so["spec"]["triggers"]
    assert trigger["type"] == "aws-sqs-queue"
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    meta = trigger["metadata"]
    assert set(meta) <= SQS_METADATA
    assert {"queueURL", "queueLength", "awsRegion", "awsEndpoint"} <= set(meta)
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's metadata is strings
    assert int(meta["queueLength"]) > 0
    # the endpoint is the data nodes' Service on their port, in the namespace of squall
    ep = urlsplit(meta["awsEndpoint"])
    assert ep.port == 7071 and ep.hostname == "squall-data.squall.svc.cluster.local"
    q = urlsplit(meta["queueURL"])
    assert q.netloc == ep.netloc
    assert len(q.path.strip("/").split("/")) == 2  # /<group>/<queue>, as KEDA parses it
    # the TriggerAuthentication reads the access key from the Secret that exists
    refs = auth["spec"]["secretTargetRef"]
    assert {r["parameter"] for r in refs} == {"awsAccessKeyID", "awsSecretAccessKey"}
    assert {r["parameter"] for r in refs} <= AUTH_PARAMS
    for r in refs:
        assert r["name"] == secret["metadata"]["name"]
        assert r["key"] in secret["data"]
    # the worker uses the same endpoint, queue and key
    [c] = deploy["spec"]["template"]["spec"]["containers"]
    env = env_map(docs, {**c, "envFrom": [e for e in c["envFrom"] if "configMapRef" in e]})
    assert env["AWS_ENDPOINT_URL_SQS"] == meta["awsEndpoint"]
    assert env["QUEUE_URL"] == meta["queueURL"]
    assert {e["secretRef"]["name"] for e in c["envFrom"] if "secretRef" in e} == {
        secret["metadata"]["name"]}
    assert {d["metadata"]["namespace"] for d in docs} == {"squall"}


def test_data_nodes_answer_to_their_service_names() -> None:
    """The Host KEDA's requests carry (the Service's name) is one the data nodes allow."""
    host = urlsplit(find(_docs(), "ScaledObject")["spec"]["triggers"][0]["metadata"][
        "awsEndpoint"]).hostname
    prod = render("production")
    ns = find(prod, "StatefulSet", "squall-data")["metadata"]["namespace"]
    [c] = find(prod, "StatefulSet", "squall-data")["spec"]["template"]["spec"]["containers"]
    allowed = env_map(prod, c)["SQUALL_ALLOWED_HOSTS"]
    names = {n.replace("$(POD_NAMESPACE)", ns).replace("$(CLUSTER_DOMAIN)", "cluster.local")
             for n in allowed.split(",")}
    assert host in names
