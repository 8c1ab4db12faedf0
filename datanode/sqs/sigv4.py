"""AWS Signature Version 4, the verifying side (what AWS services do): parse the
``Authorization`` header or the presigned query (``X-Amz-Signature`` ...), rebuild the
canonical request and the string to sign, and compare the signature made with the day's
signing key ``HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), "sqs"), "aws4_request")``.

The signing key comes from the master (``datanode/sqs/keys.py``): the node never holds a
secret access key, only the keys derived from it for a day, a region and this service.
Refusals are SQS's errors: no signature ``MissingAuthenticationToken``, a malformed one
``IncompleteSignature``, a scope of another service or region or a mismatch
``SignatureDoesNotMatch``, a date outside 15 minutes of the node's clock (or a presigned URL
past its ``X-Amz-Expires``) ``RequestExpired``.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote

from squall.datanode.sqs.errors import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
CLOCK_SKEW_S = 15 * 60.0
PRESIGN_MAX_S = 7 * 86400
MAX_SIGNED_HEADERS = 64


@dataclass(frozen=True, slots=True)
class Signed:
    """What a request claims: checked against the signing key by :func:`check`."""

    access_key_id: str
    date: str  # YYYYMMDD of the scope
    region: str
    amz_date: str  # YYYYMMDDTHHMMSSZ
    signed_headers: list[str]
    signature: str
    presigned: bool
    expires_s: int | None


def _err(shape: str, msg: str) -> SqsError:
    return SqsError(shape, msg)


def parse(headers: dict[str, str], query: str) -> Signed:
    """The signature claims of a request (`headers` lower-cased, first of repeats)."""
    authz = headers.get("authorization")
    if authz is None:
        q = dict(parse_qsl(query, keep_blank_values=True))
        if "X-Amz-Signature" not in q and "X-Amz-Credential" not in q:
            raise _err("MissingAuthenticationToken",
                       "Request is missing Authentication Token")
        if q.get("X-Amz-Algorithm") != ALGORITHM:
            raise _err("IncompleteSignature", f"X-Amz-Algorithm must be {ALGORITHM}")
        try:
            cred, amz_date = q["X-Amz-Credential"], q["X-Amz-Date"]
            signed, sig = q["X-Amz-SignedHeaders"], q["X-Amz-Signature"]
            expires = int(q.get("X-Amz-Expires", "900"))
        except (KeyError, ValueError):
            raise _err("IncompleteSignature", "a presigned request needs X-Amz-Credential, "
                       "X-Amz-Date, X-Amz-SignedHeaders, X-Amz-Signature and a numeric "
                       "X-Amz-Expires") from None
        if not 1 <= expires <= PRESIGN_MAX_S:
            raise _err("InvalidParameterValue" if expires > 0 else "IncompleteSignature",
                       f"X-Amz-Expires must be 1-{PRESIGN_MAX_S}")
        return _claims(cred, amz_date, signed, sig, True, expires)
    scheme, _, rest = authz.strip().partition(" ")
    if scheme != ALGORITHM:
        raise _err("IncompleteSignature", f"Authorization must be {ALGORITHM} (Signature "
                   "Version 4)")
    parts: dict[str, str] = {}
    for p in rest.split(","):
        k, _, v = p.strip().partition("=")
        parts[k] = v
    if not {"Credential", "SignedHeaders", "Signature"} <= parts.keys():
        raise _err("IncompleteSignature", "Authorization header requires 'Credential', "
                   "'SignedHeaders' and 'Signature'")
    amz_date = headers.get("x-amz-date", "")
    if not amz_date:
        raise _err("IncompleteSignature", "the request needs an X-Amz-Date header")
    return _claims(parts["Credential"], amz_date, parts["SignedHeaders"],
                   parts["Signature"], False, None)


def _claims(cred: str, amz_date: str, signed: str, sig: str, presigned: bool,
            expires: int | None) -> Signed:
    bits = cred.split("/")
    if len(bits) != 5 or bits[4] != "aws4_request" or not bits[0]:
        raise _err("IncompleteSignature", "Credential must be "
                   "<access key id>/<date>/<region>/sqs/aws4_request")
    if bits[3] != SERVICE:
        raise _err("SignatureDoesNotMatch", f"Credential should be scoped to correct service: "
                   f"'{SERVICE}'")
    if len(amz_date) != 16 or amz_date[:8] != bits[1]:
        raise _err("SignatureDoesNotMatch", "Date in Credential scope does not match "
                   "YYYYMMDD from ISO-8601 version of date from HTTP")
    names = signed.split(";")
    if "host" not in names or len(names) > MAX_SIGNED_HEADERS:
        raise _err("IncompleteSignature", "SignedHeaders must include host")
    if len(sig) != 64:
        raise _err("IncompleteSignature", "the signature must be 64 hex digits")
    return Signed(bits[0], bits[1], bits[2], amz_date, names, sig.lower(), presigned, expires)


def check_time(s: Signed, now: float) -> None:
    try:
        t = calendar.timegm(time.strptime(s.amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise _err("IncompleteSignature", f"X-Amz-Date {s.amz_date!r} is not "
                   "YYYYMMDDTHHMMSSZ") from None
    if s.presigned:
        assert s.expires_s is not None
        if now > t + s.expires_s:
            raise _err("RequestExpired", "Request has expired (X-Amz-Expires)")
        if t > now + CLOCK_SKEW_S:
            raise _err("SignatureDoesNotMatch", "Signature not yet current")
        return
    if abs(now - t) > CLOCK_SKEW_S:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        raise _err("RequestExpired", f"Signature expired: {s.amz_date} is now earlier than "
                   f"{stamp} (15 min of skew allowed)" if t < now else
                   f"Signature not yet current: {s.amz_date} is more than 15 min after "
                   f"{stamp}")


def _uri(s: str) -> str:
    return quote(s, safe="-_.~")


def canonical_request(method: str, raw_path: str, query: str, headers: dict[str, list[str]],
                      s: Signed, body: bytes) -> str:
    path = quote(raw_path or "/", safe="/~")  # non-S3 services encode the path again
    pairs = parse_qsl(query, keep_blank_values=True)
    if s.presigned:
        pairs = [(k, v) for k, v in pairs if k != "X-Amz-Signature"]
    cq = "&".join(f"{_uri(k)}={_uri(v)}" for k, v in sorted(pairs))
    lines = []
    for name in s.signed_headers:
        values = headers.get(name)
        if values is None:
            raise _err("SignatureDoesNotMatch", f"signed header {name!r} is not in the request")
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}\n")
    declared = headers.get("x-amz-content-sha256")
    digest = hashlib.sha256(body).hexdigest()
    if declared and declared[0] != "UNSIGNED-PAYLOAD" and declared[0] != digest:
        raise _err("SignatureDoesNotMatch", "x-amz-content-sha256 does not match the body")
    payload = declared[0] if declared else digest
    return "\n".join([method, path, cq, "".join(lines), ";".join(s.signed_headers), payload])


def string_to_sign(s: Signed, creq: str) -> str:
    scope = f"{s.date}/{s.region}/{SERVICE}/aws4_request"
    return "\n".join([ALGORITHM, s.amz_date, scope,
                      hashlib.sha256(creq.encode()).hexdigest()])


def signing_key(secret: str, date: str, region: str) -> bytes:
    """The day's key (what the master hands a node; the secret stays with the master)."""
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, SERVICE, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def check(s: Signed, key: bytes, method: str, raw_path: str, query: str,
          headers: dict[str, list[str]], body: bytes) -> None:
    """SignatureDoesNotMatch unless the request is signed with `key`."""
    sts = string_to_sign(s, canonical_request(method, raw_path, query, headers, s, body))
    mine = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mine, s.signature):
        raise _err("SignatureDoesNotMatch", "The request signature we calculated does not "
                   "match the signature you provided. Check your AWS Secret Access Key and "
                   "signing method.")
