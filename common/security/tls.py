"""TLS on every hop, optional: what a server serves with (``--tls-cert/--tls-key``, and
``--tls-ca`` to verify peers' certificates: mutual TLS) and how its own outgoing
connections (heartbeats, node-to-node replication) and clients verify and present theirs.

Clients take ``SQUALL_TLS_CA`` (a CA bundle to verify servers with; default: the system's)
and, for mutual TLS, ``SQUALL_TLS_CERT`` / ``SQUALL_TLS_KEY``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TLSConfig:
    cert: str | None = None  # PEM certificate chain this process presents
    key: str | None = None  # its private key
    ca: str | None = None  # CA bundle that peers' certificates must chain to
    require_client_cert: bool = False  # mutual TLS: refuse a client without a certificate

    @property
    def enabled(self) -> bool:
        return bool(self.cert)

    def check(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise SystemExit("--tls-cert and --tls-key go together")
        if self.require_client_cert and not self.ca:
            raise SystemExit("--tls-require-client-cert needs --tls-ca to verify them with")

    def uvicorn_kwargs(self) -> dict[str, Any]:
        """The `uvicorn.run` arguments serving with this configuration."""
        if not self.enabled:
            return {}
        kw: dict[str, Any] = {"ssl_certfile": self.cert, "ssl_keyfile": self.key}
        if self.ca:
            kw["ssl_ca_certs"] = self.ca
            kw["ssl_cert_reqs"] = (ssl.CERT_REQUIRED if self.require_client_cert
                                   else ssl.CERT_OPTIONAL)
        return kw

    def client_context(self) -> ssl.SSLContext | bool:
        """What outgoing connections verify with (httpx `verify=`): the CA (else the
        system's), presenting this certificate for mutual TLS."""
        if not (self.ca or self.cert):
            return True
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.cert and self.key:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TLSConfig:
        """A client's configuration: SQUALL_TLS_CA, SQUALL_TLS_CERT, SQUALL_TLS_KEY."""
        env = os.environ if env is None else env
        return cls(env.get("SQUALL_TLS_CERT") or None, env.get("SQUALL_TLS_KEY") or None,
                   env.get("SQUALL_TLS_CA") or None)
