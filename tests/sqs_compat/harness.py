"""What the compatibility tests share: the endpoint they talk to and its credentials."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "compat"  # downloads kept between runs (not committed)


@dataclass(frozen=True)
class Endpoint:
    url: str
    region: str
    key_id: str
    secret: str
    account: str

    def env(self, **extra: str) -> dict[str, str]:
        """The environment an SDK or CLI child process reads its endpoint and keys from."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=self.key_id, AWS_SECRET_ACCESS_KEY=self.secret,
                   AWS_DEFAULT_REGION=self.region, AWS_REGION=self.region,
                   AWS_ENDPOINT_URL_SQS=self.url, AWS_EC2_METADATA_DISABLED="true",
                   AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        env.update(extra)
        return env

    def boto3_client(self):  # type: ignore[no-untyped-def]
        import boto3
        return boto3.client("sqs", endpoint_url=self.url, region_name=self.region,
                            aws_access_key_id=self.key_id,
                            aws_secret_access_key=self.secret)


def npm_package(name: str, version: str) -> Path | None:
    """`node_modules` holding `name@version` (installed once under build/compat), or None
    when node or npm is missing."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return None
    where = CACHE / f"npm-{name.replace('/', '_')}-{version}"
    marker = where / "node_modules" / name / "package.json"
    if not marker.exists():
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent",
                        "--prefix", str(where), f"{name}@{version}"],
                       check=True, timeout=600, capture_output=True)
    return where


def python() -> str:
    return sys.executable


def endpoint_for(cluster: Any, node: int = 1, key: tuple[str, str] | None = None,
                 group: str | None = None) -> Endpoint:
    """Data node `node`'s SQS endpoint with an access key of the admin role: a fresh one
    minted by the master (`squall auth mint --sqs`), or `key` (id, secret) imported
    (`--import-sqs-key`). The account is `group` when the key is limited to it, else the
    squall group `default`."""
    import httpx

    from tests.helpers import ADMIN

    body: dict[str, Any] = {"roles": ["admin"], "ttl_secs": 86400.0}
    if key is not None:
        body.update(access_key_id=key[0], secret_access_key=key[1])
    if group is not None:
        body["groups"] = [group]
    r = httpx.post(cluster.master_url + "/v1/auth/sqs-keys", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    made = r.json()
    return Endpoint(cluster.node_url(node), "us-east-1", made["access_key_id"],
                    made["secret_access_key"], group or "default")
