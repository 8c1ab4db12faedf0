"""How Spark code reaches squall: the master's URL, the credential and the TLS material.

Each setting comes from the first of: a data source option (``option("token", ...)``; a
keyword of ``run_stage``), the Spark conf (``spark.squall.<option>``, read from the session
by :func:`register` and by ``run_stage``), the environment of the process that plans the
job (``SQUALL_MASTER``, ``SQUALL_TOKEN``, ``SQUALL_TLS_CA``, ``SQUALL_TLS_CERT``,
``SQUALL_TLS_KEY``). It is resolved once on the driver and shipped to the executors inside
the job (a Spark executor has none of the driver's environment); an executor falls back to
its own environment only for what the driver resolved to nothing.

=================  ==============================  ===================
option             Spark conf                      environment
=================  ==============================  ===================
``master``         ``spark.squall.master``         ``SQUALL_MASTER``
``token``          ``spark.squall.token``          ``SQUALL_TOKEN``
``tls_ca``         ``spark.squall.tls_ca``         ``SQUALL_TLS_CA``
``tls_cert``       ``spark.squall.tls_cert``       ``SQUALL_TLS_CERT``
``tls_key_secret`` ``spark.squall.tls_key_secret`` ``SQUALL_TLS_KEY``
=================  ==============================  ===================

The names of the secret ones hold "token" or "secret", so Spark's default
``spark.redaction.regex`` hides their values in its UI, event logs and plans. TLS values
are a file path or the PEM text itself; a path the driver can read is read there and its
text shipped, so executors need no copy of the file (a path it cannot read is shipped as
is, for executors that have it). Secrets stay out of every ``repr``.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from squall.client import Client

CONF_PREFIX = "spark.squall."
ENV = {"master": "SQUALL_MASTER", "token": "SQUALL_TOKEN", "tls_ca": "SQUALL_TLS_CA",
       "tls_cert": "SQUALL_TLS_CERT", "tls_key_secret": "SQUALL_TLS_KEY"}
KEYS = tuple(ENV)
CONF_KEYS = tuple(CONF_PREFIX + k for k in KEYS)
_PEM = "-----BEGIN"
_FILES = threading.Lock()
_DIR: tuple[int, str] | None = None  # (pid, folder) of the PEM files written


@dataclass(frozen=True)
class Conn:
    """The credential and TLS material one job's clients use (pickled to the executors)."""

    token: str | None = field(default=None, repr=False)
    tls_ca: str | None = None  # PEM text, or a path the driver could not read
    tls_cert: str | None = field(default=None, repr=False)  # may hold its key too
    tls_key: str | None = field(default=None, repr=False)

    def client(self, master: str | None, **kw: Any) -> Client:
        """A squall ``Client`` with this credential and TLS material (``kw``: the client's
        other arguments). Without TLS material here, the client's own defaults apply."""
        from squall.client import Client, TLSConfig

        if not (self.tls_ca or self.tls_cert or self.tls_key):
            return Client(master, token=self.token, **kw)
        tls = TLSConfig(cert=_file(self.tls_cert), key=_file(self.tls_key or self._key_in_cert()),
                        ca=_file(self.tls_ca))
        return Client(master, token=self.token, tls=tls, **kw)

    def _key_in_cert(self) -> str | None:
        """A certificate file that holds its private key too (one PEM with both)."""
        return self.tls_cert if self.tls_cert and "PRIVATE KEY" in _text(self.tls_cert) else None


def _text(value: str) -> str:
    if _PEM in value:
        return value
    try:
        with open(value) as f:
            return f.read()
    except OSError:
        return ""


def _material(value: str | None) -> str | None:
    """PEM text for `value` (PEM text, or a path read here), else the path itself."""
    if not value or _PEM in value:
        return value or None
    try:
        with open(value) as f:
            text = f.read()
    except OSError:
        return value  # not on this machine: the executors may have it
    return text if _PEM in text else value


def _file(value: str | None) -> str | None:
    """A path holding `value` (PEM text is written once per content to a private file)."""
    if not value or _PEM not in value:
        return value or None
    global _DIR
    with _FILES:
        if _DIR is None or _DIR[0] != os.getpid():  # this process's own (0700; not a fork's)
            _DIR = (os.getpid(), tempfile.mkdtemp(prefix="squall-spark-"))
            atexit.register(shutil.rmtree, _DIR[1], True)
        path = os.path.join(_DIR[1], hashlib.sha256(value.encode()).hexdigest()[:32] + ".pem")
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(value)
    return path


def _check(source: Mapping[str, str | None], prefix: str) -> None:
    if source.get(prefix + "tls_key"):
        raise ValueError(f"{prefix}tls_key is not read: the client's private key goes in "
                         f"{prefix}tls_key_secret (a name Spark redacts)")
    cert = source.get(prefix + "tls_cert") or ""
    if _PEM in cert and "PRIVATE KEY" in cert:
        raise ValueError(f"{prefix}tls_cert holds a private key: pass the key as "
                         f"{prefix}tls_key_secret (a name Spark redacts)")


def resolve(options: Mapping[str, Any], conf: Mapping[str, str | None] | None = None,
            env: Mapping[str, str] | None = None, *, spark_options: bool = True
            ) -> tuple[str | None, Conn]:
    """(master URL, Conn): each setting from `options`, else `conf` (``spark.squall.*``),
    else `env` (default: this process's environment). Empty values count as unset.
    `spark_options`: `options` are a data source's, whose names Spark may display (a
    private key there must be in ``tls_key_secret``)."""
    conf = conf or {}
    env = os.environ if env is None else env
    if spark_options:
        _check(options, "")
    _check(conf, CONF_PREFIX)

    def pick(key: str) -> str | None:
        for v in (options.get(key), conf.get(CONF_PREFIX + key), env.get(ENV[key])):
            if isinstance(v, list | tuple):  # several master addresses
                v = ",".join(str(x) for x in v)
            if v not in (None, ""):
                return str(v)
        return None

    return pick("master"), Conn(token=pick("token"), tls_ca=_material(pick("tls_ca")),
                                tls_cert=_material(pick("tls_cert")),
                                tls_key=_material(pick("tls_key_secret")))


def session_conf(spark: Any) -> dict[str, str]:
    """The session's ``spark.squall.*`` settings (the keys above)."""
    out: dict[str, str] = {}
    for key in (*CONF_KEYS, CONF_PREFIX + "tls_key"):
        try:
            v = spark.conf.get(key, None)
        except Exception:  # pragma: no cover - a conf that refuses to answer
            v = None
        if v:
            out[key] = str(v)
    return out
