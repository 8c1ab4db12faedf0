"""The SQS actions (docs/sqs.md has the table of what is supported and how it maps).

Each action takes the request's JSON document and answers a JSON document, or raises
SqsError. Messages go in through this node's front door (``datanode/frontdoor.py``: the
payload is stored here and on the block's peers, never on the master) and come out of a
lease the endpoint takes from the master on the caller's behalf (``upstream.py``), with
their payloads read from this node's store or a replica.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from squall.common.errors import OutcomeUnknown, StatusError
from squall.common.wire.payload import OK, decode_frames
from squall.datanode.replication.peers import PeerUnreachable
from squall.datanode.sqs import framing, handles
from squall.datanode.sqs import queues as Q
from squall.datanode.sqs.errors import SqsError, invalid
from squall.datanode.sqs.keys import Principal
from squall.datanode.sqs.md5 import md5_attributes, md5_body
from squall.datanode.sqs.upstream import Upstream

if TYPE_CHECKING:
    from squall.datanode.service import DataNode

BATCH_MAX = 10
BATCH_BYTES = 1 << 20  # a batch's bodies and attributes together, as SQS counts them
ENTRY_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
ATTR_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,256}")
MAX_ATTRS = 10
READ_MAX = 4 << 20  # a received payload larger than this comes back as an empty body
QUEUE_CACHE_S = 5.0
QUEUE_CACHE_MAX = 10_000
# characters SQS allows in a body: #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF
BAD_CHARS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
SYSTEM_ATTRS = ("SenderId", "SentTimestamp", "ApproximateReceiveCount",
                "ApproximateFirstReceiveTimestamp", "SequenceNumber", "MessageDeduplicationId",
                "MessageGroupId", "AWSTraceHeader")


@dataclass
class Ctx:
    node: DataNode
    principal: Principal
    up: Upstream
    base: str  # scheme://host of the request: queue URLs are made with it
    region: str
    key_id: str


class State:
    """Per node: the queue attribute cache and the message id clock."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self._last = 0
        self._seq = 0
        self._lock = threading.Lock()

    def message_id(self) -> str:
        """A UUID-shaped id whose text order is time order (ms, then a counter), so squall
        serves messages in the order they were sent (its queues serve the smallest pid
        first)."""
        with self._lock:
            ms = int(time.time() * 1000)
            if ms <= self._last:
                self._seq += 1
                ms = self._last
            else:
                self._seq = 0
            self._last = ms
            h = f"{ms:012x}{self._seq & 0xffff:04x}{os.urandom(8).hex()}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def forget(self, group: str, queue: str) -> None:
        self.queues.pop((group, queue), None)


def _state(node: DataNode) -> State:
    st: State | None = node.sqs_state
    if st is None:
        st = node.sqs_state = State()
    return st


def _now_ms() -> str:
    return str(int(time.time() * 1000))


# -- helpers ------------------------------------------------------------------------------
async def _policy(ctx: Ctx, group: str, queue: str, fresh: bool = False) -> dict[str, Any]:
    """The queue's effective policy; QueueDoesNotExist unless SQS created it or squall
    knows it (it has held a task). Cached for a few seconds per node."""
    st = _state(ctx.node)
    hit = st.queues.get((group, queue))
    now = time.monotonic()
    if hit is not None and not fresh and now < hit[0]:
        return hit[1]
    policy = await ctx.up.policy(group, queue)
    sqs = policy.get("sqs") or {}
    made = "CreatedTimestamp" in sqs or queue == Q.CATALOG
    if not made and (Q.DELETED in sqs or await ctx.up.stats(group, queue) is None):
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    if len(st.queues) >= QUEUE_CACHE_MAX:
        st.queues.clear()
    st.queues[(group, queue)] = (now + QUEUE_CACHE_S, policy)
    return policy


def _with_sqs(policy: dict[str, Any], sqs: dict[str, Any]) -> dict[str, Any]:
    """The queue's own policy with `sqs` as its SQS attributes."""
    return {**policy, "sqs": sqs}


async def _save(ctx: Ctx, group: str, queue: str, policy: dict[str, Any]) -> None:
    await ctx.up.set_policy(group, queue, policy)
    _state(ctx.node).forget(group, queue)


def _queue_of(ctx: Ctx, doc: dict[str, Any]) -> tuple[str, str]:
    """(group, queue) of the request's QueueUrl: a URL, or a bare queue name (SQS takes
    one, in the caller's account; here the access key's home group)."""
    url = doc.get("QueueUrl")
    if isinstance(url, str) and url and "/" not in url:
        url = f"/{ctx.principal.home_group}/{url}"
    return Q.parse_url(url)


def _int(doc: dict[str, Any], name: str, lo: int, hi: int, default: int | None
         ) -> int | None:
    v = doc.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise invalid(f"Value {v} for parameter {name} is invalid. Reason: must be between "
                      f"{lo} and {hi}, if provided.")
    return v


def _entries(doc: dict[str, Any], key: str, kind: str) -> list[dict[str, Any]]:
    entries = doc.get(key)
    if not entries:
        raise SqsError("EmptyBatchRequest", f"There should be at least one {kind}"
                       "BatchRequestEntry in the request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid(f"{key} must be a list of entries")
    if len(entries) > BATCH_MAX:
        raise SqsError("TooManyEntriesInBatchRequest",
                       f"Maximum number of entries per request are {BATCH_MAX}. You have sent "
                       f"{len(entries)}.")
    seen: set[str] = set()
    for e in entries:
        i = e.get("Id")
        if not isinstance(i, str) or not ENTRY_ID_RE.fullmatch(i):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain "
                           "alphanumeric characters, hyphens and underscores. It can be at "
                           "most 80 letters long.")
        if i in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {i} repeated.")
        seen.add(i)
    return entries


def _check_attrs(attrs: object) -> dict[str, dict[str, Any]]:
    if not attrs:
        return {}
    if not isinstance(attrs, dict):
        raise invalid("MessageAttributes must be a map")
    if len(attrs) > MAX_ATTRS:
        raise invalid(f"Number of message attributes [{len(attrs)}] exceeds the allowed "
                      f"maximum [{MAX_ATTRS}].")
    return {name: _check_attr(name, a) for name, a in attrs.items()}


def _check_attr_name(name: str) -> None:
    low = name.lower()
    if (not ATTR_NAME_RE.fullmatch(name) or low.startswith(("aws.", "amazon."))
            or name.startswith(".") or name.endswith(".") or ".." in name):
        raise invalid(f"The message attribute name '{name}' is invalid. Attribute name can "
                      "contain A-Z, a-z, 0-9, underscore (_), hyphen (-), and period (.) "
                      "characters.")


def _check_attr(name: str, a: object) -> dict[str, Any]:
    _check_attr_name(name)
    if not isinstance(a, dict):
        raise invalid(f"Message attribute '{name}' must be a map")
    t = a.get("DataType")
    if not isinstance(t, str) or not t:
        raise invalid(f"The message attribute '{name}' must contain non-empty message "
                      "attribute value for message attribute type ''.")
    kind = t.split(".", 1)[0]
    if kind not in ("String", "Number", "Binary"):
        raise invalid(f"The message attribute '{name}' has an invalid message attribute "
                      "type, the set of supported type prefixes is Binary, Number, and String.")
    if kind == "Binary":
        v = a.get("BinaryValue")
        if isinstance(v, str):  # base64 on the JSON wire
            try:
                v = base64.b64decode(v, validate=True)
            except ValueError:
                raise invalid(f"Message attribute '{name}': BinaryValue is not base64") \
                    from None
        if not isinstance(v, bytes) or not v:
            raise invalid(f"The message attribute '{name}' with type 'Binary' must use "
                          "field 'Binary'.")
        return {"DataType": t, "BinaryValue": v}
    v = a.get("StringValue")
    if not isinstance(v, str) or not v:
        raise invalid(f"The message attribute '{name}' with type '{kind}' must use field "
                      "'String'.")
    if BAD_CHARS.search(v):
        raise SqsError("InvalidMessageContents", f"Message attribute '{name}' contains "
                       "invalid characters")
    if kind == "Number":
        try:
            float(v)
        except ValueError:
            raise invalid(f"Can't cast message attribute '{name}' to a number.") from None
    return {"DataType": t, "StringValue": v}


def _attrs_size(attrs: dict[str, dict[str, Any]]) -> int:
    n = 0
    for k, a in attrs.items():
        v = a.get("BinaryValue") or a.get("StringValue", "").encode()
        n += len(k.encode()) + len(a["DataType"].encode()) + len(v)
    return n


def _wire_attrs(attrs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Attributes as the JSON protocol carries them (binary values in base64)."""
    return {k: ({"DataType": a["DataType"], "BinaryValue": base64.b64encode(
        a["BinaryValue"]).decode()} if "BinaryValue" in a else dict(a))
        for k, a in attrs.items()}


def _sequence(pid: str) -> str:
    digits = pid.replace("-", "")[:16]
    try:
        return str(int(digits, 16)).zfill(20)
    except ValueError:
        return str(int.from_bytes(hashlib.sha256(pid.encode()).digest()[:8], "big")).zfill(20)


# -- queues ------------------------------------------------------------------------------
async def create_queue(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    name = Q.check_sqs_name(doc.get("QueueName"))
    group = ctx.principal.home_group
    fifo = name.endswith(Q.FIFO)
    given = Q.check_attributes(doc.get("Attributes"), fifo, creating=True)
    tag_doc = doc.get("tags") or {}
    if not isinstance(tag_doc, dict) or len(tag_doc) > Q.MAX_TAGS:
        raise invalid(f"tags must be a map of at most {Q.MAX_TAGS}")
    url = Q.url_of(ctx.base, group, name)
    policy = await ctx.up.policy(group, name)
    sqs = dict(policy.get("sqs") or {})
    if "CreatedTimestamp" in sqs:  # exists: the same attributes answer its URL
        current = Q.attributes(policy, group, name, ctx.region, None)
        for k, v in given.items():
            if current.get(k, "") != v and not (k == "RedrivePolicy" and _same_json(
                    current.get(k, ""), v)):
                raise SqsError("QueueNameExists", "A queue already exists with the same name "
                               f"and a different value for attribute {k}")
        return {"QueueUrl": url}
    now = str(int(time.time()))
    sqs = {**Q.DEFAULTS, **(Q.FIFO_DEFAULTS if fifo else {}), **given,
           "CreatedTimestamp": now, "LastModifiedTimestamp": now,
           **{Q.TAG + str(k): str(v) for k, v in tag_doc.items()}}
    await _save(ctx, group, name, Q.policy_with(policy, sqs, group, name))
    await _catalog(ctx, group, name, add=True)
    return {"QueueUrl": url}


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(orjson.loads(a) == orjson.loads(b))
    except orjson.JSONDecodeError:
        return False


async def _catalog(ctx: Ctx, group: str, name: str, add: bool) -> None:
    """Keep the group's list of SQS-created queues (ListQueues shows them before they hold
    a task). Read-modify-write: two nodes adding at once may lose one name from the list
    (never the queue)."""
    policy = await ctx.up.policy(group, Q.CATALOG)
    names = dict(policy.get("sqs") or {})
    if add:
        if names.get(name) == Q.LISTED:
            return
        if name not in names and len(names) >= Q.CATALOG_MAX:
            return  # still a queue; listed once it holds a task
        names[name] = Q.LISTED
    else:  # squall still lists a deleted queue that held tasks: the mark leaves it out
        if names.get(name) == Q.UNLISTED or (
                name not in names and len(names) >= Q.CATALOG_MAX):
            return
        names[name] = Q.UNLISTED
    await ctx.up.set_policy(group, Q.CATALOG, _with_sqs(policy, names))


async def get_queue_url(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    name = doc.get("QueueName")
    if not isinstance(name, str) or not name:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
    group = doc.get("QueueOwnerAWSAccountId") or ctx.principal.home_group
    try:
        Q.parse_url(f"/{group}/{name}")
    except SqsError:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None
    await _policy(ctx, group, name, fresh=True)
    return {"QueueUrl": Q.url_of(ctx.base, group, name)}


async def list_queues(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group = ctx.principal.home_group
    prefix = doc.get("QueueNamePrefix") or ""
    if not isinstance(prefix, str):
        raise invalid("QueueNamePrefix must be a string")
    limit = _int(doc, "MaxResults", 1, 1000, None)
    token = doc.get("NextToken")
    after = ""
    if token is not None:
        try:
            after = base64.urlsafe_b64decode(str(token).encode()).decode()
        except ValueError:
            raise invalid("Invalid NextToken") from None
    catalog: dict[str, str] = (await ctx.up.policy(group, Q.CATALOG)).get("sqs") or {}
    names = {n for n, v in catalog.items() if v != Q.UNLISTED}
    page_after: str | None = None
    for _ in range(100):  # at most 100,000 queues of the group are looked at
        res = await ctx.up.queues(group, 1000, page_after)
        names.update(q["queue"] for q in res.get("queues", []))
        page_after = res.get("next")
        if not page_after:
            break
    names.discard(Q.CATALOG)
    names.difference_update(n for n, v in catalog.items() if v == Q.UNLISTED)
    picked = sorted(n for n in names if n.startswith(prefix) and n > after)
    cap = limit or 1000
    out: dict[str, Any] = {}
    if picked:
        out["QueueUrls"] = [Q.url_of(ctx.base, group, n) for n in picked[:cap]]
    if limit is not None and len(picked) > cap:
        out["NextToken"] = base64.urlsafe_b64encode(picked[cap - 1].encode()).decode()
    return out


async def delete_queue(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, name = _queue_of(ctx, doc)
    await _policy(ctx, group, name, fresh=True)
    if await ctx.up.stats(group, name) is not None:
        await ctx.up.delete_queue(group, name)
    # squall keeps a queue's counters past a delete: the mark says SQS deleted it
    await ctx.up.set_policy(group, name, {"sqs": {Q.DELETED: str(int(time.time()))}})
    _state(ctx.node).forget(group, name)
    await _catalog(ctx, group, name, add=False)
    return {}


async def purge_queue(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, name = _queue_of(ctx, doc)
    await _policy(ctx, group, name)
    if await ctx.up.stats(group, name) is not None:
        await ctx.up.delete_queue(group, name)  # every task, leased or not; the policy stays
    return {}


async def get_queue_attributes(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, name = _queue_of(ctx, doc)
    wanted = doc.get("AttributeNames") or []
    if not isinstance(wanted, list):
        raise invalid("AttributeNames must be a list")
    for w in wanted:
        if w != "All" and w not in Q.ALL_NAMES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {w}.")
    policy = await _policy(ctx, group, name, fresh=True)
    if not wanted:
        return {}
    counts = "All" in wanted or any(w in Q.COUNTS for w in wanted)
    stats = await ctx.up.stats(group, name) if counts else None
    every = Q.attributes(policy, group, name, ctx.region, stats)
    if "All" in wanted:
        return {"Attributes": every}
    picked = {w: every[w] for w in wanted if w in every}
    return {"Attributes": picked} if picked else {}


async def set_queue_attributes(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, name = _queue_of(ctx, doc)
    policy = await _policy(ctx, group, name, fresh=True)
    given = Q.check_attributes(doc.get("Attributes"), name.endswith(Q.FIFO), creating=False)
    sqs = {**(policy.get("sqs") or {}), **given, "LastModifiedTimestamp": str(int(time.time()))}
    for k in ("Policy", "RedriveAllowPolicy"):  # set to "": removed, as SQS does
        if sqs.get(k) == "":
            del sqs[k]
    sqs.setdefault("CreatedTimestamp", sqs["LastModifiedTimestamp"])
    await _save(ctx, group, name, Q.policy_with(policy, sqs, group, name))
    return {}


async def tag_queue(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, name = _queue_of(ctx, doc)
    new = doc.get("Tags")
    if not isinstance(new, dict) or not new:
        raise invalid("The request must contain the parameter Tags.")
    policy = await _policy(ctx, group, name, fresh=True)
    sqs = dict(policy.get("sqs") or {})
    for k, v in new.items():
        if not isinstance(v, str) or not 1 <= len(str(k)) <= 128 or len(v) > 256:
            raise invalid(f"Tag {str(k)[:130]!r}: keys are 1-128 characters, values at most "
                          "256")
        sqs[Q.TAG + str(k)] = v
    if sum(k.startswith(Q.TAG) for k in sqs) > Q.MAX_TAGS:
        raise invalid(f"Too many tags added for queue {name}.")
    await _save(ctx, group, name, _with_sqs(policy, sqs))
    return {}


async def untag_queue(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, name = _queue_of(ctx, doc)
    keys = doc.get("TagKeys")
    if not isinstance(keys, list) or not keys:
        raise invalid("Tag keys must be between 1 and 128 characters in length.")
    policy = await _policy(ctx, group, name, fresh=True)
    sqs = {k: v for k, v in (policy.get("sqs") or {}).items()
           if not (k.startswith(Q.TAG) and k[len(Q.TAG):] in keys)}
    await _save(ctx, group, name, _with_sqs(policy, sqs))
    return {}


async def list_queue_tags(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, name = _queue_of(ctx, doc)
    t = Q.tags(await _policy(ctx, group, name, fresh=True))
    return {"Tags": t} if t else {}


async def start_message_move_task(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    """squall's redrive: the dead letters of a queue's dead-letter queue go back to the
    queue (``SourceArn`` the dead-letter queue; ``DestinationArn`` the queue, optional when
    the dead-letter queue is squall's default ``<queue>.dead``). Runs to the end before it
    answers (bounded: 100,000 messages a call)."""
    group, dlq = Q.parse_arn(doc.get("SourceArn"))
    dest = doc.get("DestinationArn")
    if dest:
        g2, origin = Q.parse_arn(dest)
        if g2 != group:
            raise invalid("The source and destination queues must be in the same group "
                          "(account id)")
    elif dlq.endswith(".dead"):
        origin = dlq[:-len(".dead")]
    else:
        raise invalid("Give DestinationArn: squall moves dead letters back to the queue "
                      "they came from")
    await _policy(ctx, group, dlq)
    moved = 0
    for _ in range(100):
        res = await ctx.up.redrive(group, origin, 1000)
        moved += int(res.get("moved", 0))
        if int(res.get("moved", 0)) < 1000:
            break
    handle = base64.urlsafe_b64encode(orjson.dumps(
        {"g": group, "q": dlq, "moved": moved, "t": _now_ms()})).decode()
    return {"TaskHandle": handle}


# AddPermission's actions (the batch forms come with their action); the owner's own are not
PERMISSION_ACTIONS = {"*", "ChangeMessageVisibility", "DeleteMessage", "GetQueueAttributes",
                      "GetQueueUrl", "ListDeadLetterSourceQueues", "PurgeQueue",
                      "ReceiveMessage", "SendMessage"}
MAX_PERMISSION_ACTIONS = 7


def _queue_policy(sqs: dict[str, Any], arn: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(sqs.get("Policy") or "{}")
    except orjson.JSONDecodeError:
        doc = {}
    if not isinstance(doc, dict) or not isinstance(doc.get("Statement"), list):
        doc = {"Version": "2012-10-17", "Id": f"{arn}/SQSDefaultPolicy", "Statement": []}
    return doc


async def add_permission(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    """A statement in the queue's Policy, as SQS writes it. Stored and answered, not
    applied, like Policy itself: squall's roles and groups decide access (docs/sqs.md)."""
    group, name = _queue_of(ctx, doc)
    label, accounts, actions = doc.get("Label"), doc.get("AWSAccountIds"), doc.get("Actions")
    if not isinstance(label, str) or not ENTRY_ID_RE.fullmatch(label):
        raise SqsError("MissingParameter" if not label else "InvalidParameterValue",
                       "The request must contain the parameter Label." if not label else
                       f"Value {str(label)[:100]} for parameter Label is invalid. Reason: "
                       "1-80 of A-Z a-z 0-9 _ -.")
    if not isinstance(actions, list) or not actions:
        raise SqsError("MissingParameter", "The request must contain the parameter Actions.")
    if not isinstance(accounts, list) or not accounts or not all(
            isinstance(a, str) and a for a in accounts):
        raise invalid(f"Value {accounts if isinstance(accounts, list) else ''} for "
                      "parameter PrincipalId is invalid. Reason: Unable to verify.")
    if len(actions) > MAX_PERMISSION_ACTIONS:
        raise SqsError("OverLimit", f"{len(actions)} Actions were found, maximum allowed is "
                       f"{MAX_PERMISSION_ACTIONS}.")
    for a in actions:
        if a not in PERMISSION_ACTIONS:
            raise invalid(f"Value SQS:{str(a)[:100]} for parameter ActionName is invalid. "
                          "Reason: Only the queue owner is allowed to invoke this action.")
    policy = await _policy(ctx, group, name, fresh=True)
    sqs = dict(policy.get("sqs") or {})
    arn = Q.arn_of(ctx.region, group, name)
    qp = _queue_policy(sqs, arn)
    if any(isinstance(st, dict) and st.get("Sid") == label for st in qp["Statement"]):
        raise invalid(f"Value {label} for parameter Label is invalid. Reason: Already "
                      "exists.")
    principals = [f"arn:aws:iam::{a}:root" for a in accounts]
    verbs = [f"SQS:{a}" for a in actions]
    qp["Statement"].append({"Sid": label, "Effect": "Allow",
                            "Principal": {"AWS": principals[0] if len(principals) == 1
                                          else principals},
                            "Action": verbs[0] if len(verbs) == 1 else verbs,
                            "Resource": arn})
    sqs["Policy"] = orjson.dumps(qp).decode()
    if len(sqs["Policy"]) > 20480:
        raise invalid("The queue's Policy would be longer than 20480 characters.")
    await _save(ctx, group, name, _with_sqs(policy, sqs))
    return {}


async def remove_permission(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, name = _queue_of(ctx, doc)
    label = doc.get("Label")
    if not isinstance(label, str) or not label:
        raise SqsError("MissingParameter", "The request must contain the parameter Label.")
    policy = await _policy(ctx, group, name, fresh=True)
    sqs = dict(policy.get("sqs") or {})
    qp = _queue_policy(sqs, Q.arn_of(ctx.region, group, name))
    kept = [st for st in qp["Statement"] if not (isinstance(st, dict)
                                                 and st.get("Sid") == label)]
    if len(kept) == len(qp["Statement"]):
        raise invalid(f"Value {label[:100]} for parameter Label is invalid. Reason: can't "
                      "find label on existing policy.")
    if kept:
        sqs["Policy"] = orjson.dumps({**qp, "Statement": kept}).decode()
    else:
        sqs.pop("Policy", None)
    await _save(ctx, group, name, _with_sqs(policy, sqs))
    return {}


# -- messages ----------------------------------------------------------------------------
@dataclass
class _Out:
    """One message to send, checked."""

    entry_id: str
    msg: framing.Message
    delay: float | None
    dedup_key: str | None
    answer: dict[str, Any]


def _prepare(ctx: Ctx, e: dict[str, Any], policy: dict[str, Any], group: str, queue: str,
             entry_id: str) -> _Out:
    body = e.get("MessageBody")
    if not isinstance(body, str) or body == "":
        raise SqsError("MissingParameter", "The request must contain the parameter "
                       "MessageBody.")
    if BAD_CHARS.search(body):
        raise SqsError("InvalidMessageContents", "Invalid characters found. Valid unicode "
                       "characters are #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | "
                       "#x10000 to #x10FFFF")
    attrs = _check_attrs(e.get("MessageAttributes"))
    sqs = policy.get("sqs") or {}
    limit = int(sqs.get("MaximumMessageSize", Q.DEFAULTS["MaximumMessageSize"]))
    size = len(body.encode()) + _attrs_size(attrs)
    if size > limit:
        raise invalid(f"One or more parameters are invalid. Reason: Message must be shorter "
                      f"than {limit} bytes.")
    fifo = queue.endswith(Q.FIFO)
    gid, did = e.get("MessageGroupId"), e.get("MessageDeduplicationId")
    delay = _int(e, "DelaySeconds", 0, 900, None)
    trace = _trace(e.get("MessageSystemAttributes"))
    for label, v in (("MessageGroupId", gid), ("MessageDeduplicationId", did)):
        if v is not None and (not isinstance(v, str) or not 1 <= len(v) <= 128):
            raise invalid(f"Value {v} for parameter {label} is invalid. Reason: it must be "
                          "1-128 characters.")
    key = _dedup_key(sqs, queue, body, gid, did, delay) if fifo else None
    if did and not fifo:
        raise invalid(f"Value {did} for parameter MessageDeduplicationId is invalid. Reason: "
                      "The request include parameter that is not valid for this queue "
                      "type.")
    if delay is None:
        delay = int(sqs.get("DelaySeconds", "0"))
    msg = framing.Message(body, attrs, gid if gid else None,
                          e.get("MessageDeduplicationId") if fifo else None, trace,
                          ctx.key_id if (attrs or gid or trace) else None)
    answer: dict[str, Any] = {"MD5OfMessageBody": md5_body(body)}
    if attrs:
        answer["MD5OfMessageAttributes"] = md5_attributes(attrs)
    if trace is not None:
        answer["MD5OfMessageSystemAttributes"] = md5_attributes(
            {"AWSTraceHeader": {"DataType": "String", "StringValue": trace}})
    return _Out(entry_id, msg, float(delay) if delay else None, key, answer)


def _raw_size(e: dict[str, Any]) -> int:
    """An entry's body and attribute bytes as sent (before they are checked)."""
    body = e.get("MessageBody")
    n = len(body.encode()) if isinstance(body, str) else 0
    attrs = e.get("MessageAttributes")
    if isinstance(attrs, dict):
        for k, a in attrs.items():
            n += len(str(k).encode())
            if isinstance(a, dict):
                for f in ("DataType", "StringValue", "BinaryValue"):
                    v = a.get(f)
                    if isinstance(v, str):
                        n += len(v.encode()) if f != "BinaryValue" else len(v) * 3 // 4
    return n


def _trace(sys_attrs: object) -> str | None:
    if not isinstance(sys_attrs, dict) or "AWSTraceHeader" not in sys_attrs:
        return None
    t = sys_attrs["AWSTraceHeader"]
    if not isinstance(t, dict) or t.get("DataType") != "String" or not isinstance(
            t.get("StringValue"), str):
        raise invalid("AWSTraceHeader must be a String attribute")
    return str(t["StringValue"])


NO_GROUP = "The request must contain the parameter MessageGroupId."
NO_DEDUP = ("The queue should either have ContentBasedDeduplication enabled or "
            "MessageDeduplicationId provided explicitly")
WHOLE_BATCH = (NO_GROUP, NO_DEDUP)  # errors SQS gives for a whole SendMessageBatch


def _dedup_key(sqs: dict[str, str], queue: str, body: str, gid: object, did: object,
               delay: int | None) -> str:
    """The idempotency key of a FIFO message: squall's enqueue deduplication (5 minutes,
    per group) over the queue, the scope and the deduplication id."""
    if not gid:
        raise SqsError("MissingParameter", NO_GROUP)
    if delay is not None and delay > 0:
        raise invalid(f"Value {delay} for parameter DelaySeconds is invalid. Reason: The "
                      "request include parameter that is not valid for this queue type.")
    if not did:
        if sqs.get("ContentBasedDeduplication") != "true":
            raise invalid(NO_DEDUP)
        did = hashlib.sha256(body.encode()).hexdigest()
    scope = gid if sqs.get("DeduplicationScope") == "messageGroup" else ""
    return "sqs:" + hashlib.sha256(f"{queue}\x00{scope}\x00{did}".encode()).hexdigest()


def _may_send(ctx: Ctx, group: str) -> None:
    if not ctx.principal.may({"producer"}, group):
        raise SqsError("AccessDenied", f"Access to the resource {group}/... is denied: the "
                       "access key needs the producer role for this group.")


async def _enqueue(ctx: Ctx, group: str, queue: str, outs: list[_Out]) -> list[str]:
    """Through this node's front door; the message ids, in order (a deduplicated one is
    the first message's id)."""
    fd = ctx.node.frontdoor
    if fd is None:
        raise SqsError("ServiceUnavailable", "the front door is not running on this node")
    st = _state(ctx.node)
    tasks = []
    for o in outs:
        t: dict[str, Any] = {"pid": st.message_id(), "payload": framing.encode(o.msg)}
        if o.delay:
            t["delay_secs"] = o.delay
        if o.dedup_key:
            t["idempotency_key"] = o.dedup_key
        if o.msg.group_id and queue.endswith(Q.FIFO):
            t["key"] = Q.flow_key(o.msg.group_id)  # the queue's key_limit is 1
        tasks.append(t)
    try:
        res = await fd.enqueue(group, queue, tasks)
    except OutcomeUnknown as e:
        raise SqsError("ServiceUnavailable", f"outcome unknown: {e.message} (resending may "
                       "send twice on a standard queue)") from None
    except StatusError as e:
        if e.status == 403:
            raise SqsError("AccessDenied", e.message) from None
        if e.status in (400, 413, 422):
            raise invalid(e.message) from None
        raise SqsError("ServiceUnavailable", e.message) from None
    return [str(r["pid"]) for r in res["enqueued"]]


async def send_message(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, queue = _queue_of(ctx, doc)
    _may_send(ctx, group)
    policy = await _policy(ctx, group, queue)
    o = _prepare(ctx, doc, policy, group, queue, "")
    (pid,) = await _enqueue(ctx, group, queue, [o])
    return _sent(queue, o, pid)


def _sent(queue: str, o: _Out, pid: str) -> dict[str, Any]:
    """The answer for a message sent (a batch entry's without its Id)."""
    out = {**o.answer, "MessageId": pid}
    if queue.endswith(Q.FIFO):
        out["SequenceNumber"] = _sequence(pid)
    return out


async def send_message_batch(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, queue = _queue_of(ctx, doc)
    entries = _entries(doc, "Entries", "SendMessage")
    _may_send(ctx, group)
    policy = await _policy(ctx, group, queue)
    total = sum(_raw_size(e) for e in entries)
    if total > BATCH_BYTES:  # the whole request, before any entry is looked at (as SQS)
        raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than "
                       f"{BATCH_BYTES} bytes. You have sent {total} bytes.")
    outs: list[_Out] = []
    failed: list[dict[str, Any]] = []
    for e in entries:
        try:
            o = _prepare(ctx, e, policy, group, queue, e["Id"])
        except SqsError as err:
            if err.shape in WHOLE_BATCH or err.message in WHOLE_BATCH:
                raise  # SQS refuses the request, not the entry
            failed.append(err.entry(e["Id"]))
            continue
        outs.append(o)
    ok: list[dict[str, Any]] = []
    if outs:
        pids = await _enqueue(ctx, group, queue, outs)
        ok = [{"Id": o.entry_id, **_sent(queue, o, pid)}
              for o, pid in zip(outs, pids, strict=True)]
    return {"Successful": ok, "Failed": failed}


async def _payloads(ctx: Ctx, refs: list[dict[str, Any]], token: str | None
                    ) -> dict[str, bytes | None]:
    """Blob id -> bytes (None: too large to receive) from this node's store, else a
    replica's batch-get under the lease's read token."""
    node = ctx.node
    got: dict[str, bytes | None] = {}
    ids = [r["blob_id"] for r in refs]
    while ids:
        smalls = await node.store.run(node.store.read_small, ids, READ_MAX)
        for s in smalls:
            if s.too_large:
                got[s.blob_id] = None
            elif s.error is None and s.meta is not None:
                got[s.blob_id] = s.data
        ids = ids[len(smalls):]
    missing = [r for r in refs if r["blob_id"] not in got]
    for attempt in range(4):
        if not missing or token is None:
            break
        by_node: dict[str, list[str]] = {}
        for r in missing:
            others = [u for u in r.get("replicas") or [] if u.rstrip("/") != node.address]
            if others:
                by_node.setdefault(others[attempt % len(others)], []).append(r["blob_id"])
        for url, bids in by_node.items():
            got.update(await _fetch(node, url, bids, token))
        missing = [r for r in missing if r["blob_id"] not in got]
    if missing:
        raise SqsError("ServiceUnavailable", f"{len(missing)} leased payloads could not be "
                       "read from any replica; they come back when their lease expires")
    return got


async def _fetch(node: DataNode, url: str, ids: list[str], token: str) -> dict[str, bytes]:
    """The payloads a replica has of `ids` (none when it cannot be asked)."""
    assert node.peers is not None
    try:
        resp = await node.peers.post(url.rstrip("/") + "/v1/blobs:batch-get",
                                     content=orjson.dumps({"blob_ids": ids, "token": token}),
                                     headers={"Content-Type": "application/json"})
        if resp.status_code != 200:
            return {}
        return {f.blob_id: f.data for f in decode_frames(resp.content) if f.status == OK}
    except (PeerUnreachable, StatusError):
        return {}


def _wanted_attrs(doc: dict[str, Any]) -> set[str]:
    names: list[Any] = [*(doc.get("AttributeNames") or []),
                        *(doc.get("MessageSystemAttributeNames") or [])]
    if "All" in names:
        return set(SYSTEM_ATTRS)
    return {str(n) for n in names}


def _pick_attrs(attrs: dict[str, dict[str, Any]], names: list[Any]) -> dict[str, Any]:
    if not names or not attrs:
        return {}
    if "All" in names or ".*" in names:
        return dict(attrs)
    out = {}
    for n in names:
        n = str(n)
        if n.endswith(".*"):
            out.update({k: v for k, v in attrs.items() if k.startswith(n[:-1])})
        elif n in attrs:
            out[n] = attrs[n]
    return out


async def receive_message(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
    group, queue = _queue_of(ctx, doc)
    policy = await _policy(ctx, group, queue)
    sqs = policy.get("sqs") or {}
    n = _int(doc, "MaxNumberOfMessages", 1, 10, 1)
    wait = _int(doc, "WaitTimeSeconds", 0, 20,
                int(sqs.get("ReceiveMessageWaitTimeSeconds", "0")))
    vt = _int(doc, "VisibilityTimeout", 0, 43200, None)
    names = doc.get("MessageAttributeNames") or []
    if not isinstance(names, list):
        raise invalid("MessageAttributeNames must be a list")
    wanted = _wanted_attrs(doc)
    assert n is not None and wait is not None
    res = await ctx.up.lease(group, queue, n, None if vt is None else max(vt, 0.001),
                             float(wait), "sqs:" + ctx.key_id)
    tasks = res.get("tasks") or []
    refs = [t["payload"] for t in tasks if t.get("payload")]
    try:
        data = await _payloads(ctx, refs, res.get("read_token")) if refs else {}
    except SqsError:  # give the leases back unseen: the messages are visible again at once
        with contextlib.suppress(SqsError):
            await ctx.up.update(group, {"release": [
                {"queue": queue, "pid": t["pid"], "token": t["token"], "unseen": True}
                for t in tasks]})
        raise
    if vt == 0 and tasks:  # visible again at once; the receive counts (as SQS)
        with contextlib.suppress(SqsError):
            await ctx.up.update(group, {"release": [
                {"queue": queue, "pid": t["pid"], "token": t["token"]} for t in tasks]})
    now = _now_ms()
    out = []
    for t in tasks:
        ref = t.get("payload")
        raw = data.get(ref["blob_id"]) if ref else b""
        m = framing.decode(raw) if raw is not None else framing.Message(
            "", {"squall.payload-size": {"DataType": "Number",
                                         "StringValue": str(ref["size"] if ref else 0)}})
        msg: dict[str, Any] = {
            "MessageId": t["pid"],
            "ReceiptHandle": handles.make(ctx.node.key, group, queue, t["pid"], t["token"]),
            "MD5OfBody": md5_body(m.body), "Body": m.body}
        sysattrs = {"SenderId": m.sender or group,
                    "SentTimestamp": str(int(float(t["enqueued_at"]) * 1000)),
                    "ApproximateReceiveCount": str(t["attempts"]),
                    "ApproximateFirstReceiveTimestamp": now if t["attempts"] <= 1 else str(
                        int(float(t["enqueued_at"]) * 1000))}
        if queue.endswith(Q.FIFO):
            sysattrs["SequenceNumber"] = _sequence(t["pid"])
        if m.group_id:
            sysattrs["MessageGroupId"] = m.group_id
        if m.dedup_id:
            sysattrs["MessageDeduplicationId"] = m.dedup_id
        if m.trace:
            sysattrs["AWSTraceHeader"] = m.trace
        picked_sys = {k: v for k, v in sysattrs.items() if k in wanted}
        if picked_sys:
            msg["Attributes"] = picked_sys
        picked = _pick_attrs(m.attrs, names)
        if picked:
            msg["MessageAttributes"] = _wire_attrs(picked)
            msg["MD5OfMessageAttributes"] = md5_attributes(picked)
        out.append(msg)
    return {"Messages": out} if out else {}


def _handle(ctx: Ctx, group: str, queue: str, h: object) -> tuple[str, str]:
    g, q, pid, token = handles.open_handle(ctx.node.key, h)
    if (g, q) != (group, queue):
        raise SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid (it is "
                       "of another queue).")
    return pid, token


async def _acts(ctx: Ctx, group: str, kind: str, items: list[dict[str, Any]]
                ) -> list[SqsError | None]:
    """Apply update items of one kind (dequeue / renew / release), all in one update when
    every lease is current, else one by one: the error of each (None: done)."""
    if not items:
        return []
    try:
        await ctx.up.update(group, {kind: items})
        return [None] * len(items)
    except SqsError as e:
        if e.shape != "MessageNotInflight" or len(items) == 1:
            if len(items) == 1:
                return [e]
            raise

    async def one(it: dict[str, Any]) -> SqsError | None:
        try:
            await ctx.up.update(group, {kind: [it]})
            return None
        except SqsError as e:
            return e
    return list(await asyncio.gather(*(one(it) for it in items)))


def _answer(entries: list[dict[str, Any]], errs: list[SqsError | None]) -> dict[str, Any]:
    """A batch action's answer: each entry Successful, or Failed with its error."""
    ok, failed = [], []
    for e, err in zip(entries, errs, strict=True):
        if err is None:
            ok.append({"Id": e["Id"]})
        else:
            failed.append(err.entry(e["Id"]))
    return {"Successful": ok, "Failed": failed}


async def _delete(ctx: Ctx, group: str, queue: str, entries: list[dict[str, Any]],
                  batch: bool = False) -> list[SqsError | None]:
    """Dequeue each entry's message: its error, or None (also for a stale handle, which
    "succeeds, but the message might not be deleted", as SQS)."""
    results: list[SqsError | None] = [None] * len(entries)
    items = []
    for i, e in enumerate(entries):
        try:
            pid, token = _handle(ctx, group, queue, e.get("ReceiptHandle"))
        except SqsError as bad:
            results[i] = _entry_error(bad, e) if batch else bad
            continue
        items.append((i, {"queue": queue, "pid": pid, "token": token}))
    errs = await _acts(ctx, group, "dequeue", [it for _, it in items])
    for (i, _), err in zip(items, errs, strict=True):
        results[i] = None if err is not None and err.shape == "MessageNotInflight" else err
    return results


def _entry_error(err: SqsError, e: dict[str, Any]) -> SqsError:
    """A batch entry's error: an invalid handle is named, as SQS does in batches."""
    if err.shape == "ReceiptHandleIsInvalid":
        return SqsError("ReceiptHandleIsInvalid", f"The input receipt handle "
                        f"\"{str(e.get('ReceiptHandle'))[:100]}\" is not a valid receipt "
                        "handle.")
    return err


def _stale(h: object) -> SqsError:
    return invalid(f"Value {str(h)[:100]} for parameter ReceiptHandle is invalid. Reason: "
                   "Message does not exist or is not available for visibility timeout "
                   "change.")


async def _change(ctx: Ctx, group: str, queue: str, entries: list[dict[str, Any]],
                  batch: bool = False) -> list[SqsError | None]:
    results: list[SqsError | None] = [None] * len(entries)
    renew, release = [], []
    for i, e in enumerate(entries):
        try:
            pid, token = _handle(ctx, group, queue, e.get("ReceiptHandle"))
            vt = _int(e, "VisibilityTimeout", 0, 43200, None)
            if vt is None:
                raise SqsError("MissingParameter", "The request must contain the parameter "
                               "VisibilityTimeout.")
        except SqsError as bad:
            results[i] = _entry_error(bad, e) if batch else bad
            continue
        item = {"queue": queue, "pid": pid, "token": token}
        if vt == 0:
            release.append((i, item))
        else:
            renew.append((i, {**item, "lease_secs": float(vt)}))
    for kind, part in (("renew", renew), ("release", release)):
        errs = await _acts(ctx, group, kind, [it for _, it in part])
        for (i, _), err in zip(part, errs, strict=True):
            results[i] = (_stale(entries[i].get("ReceiptHandle"))
                          if err is not None and err.shape == "MessageNotInflight" else err)
    return results


Action = Callable[[Ctx, dict[str, Any]], Awaitable[dict[str, Any]]]
EachHandle = Callable[[Ctx, str, str, list[dict[str, Any]], bool],
                      Awaitable[list[SqsError | None]]]


def _by_handle(each: EachHandle, kind: str) -> tuple[Action, Action]:
    """An action on receipt handles and its batch form: the queue must exist before a
    handle is looked at (as SQS); the single action raises its error, the batch answers
    each entry's."""

    async def single(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
        group, queue = _queue_of(ctx, doc)
        await _policy(ctx, group, queue)
        (err,) = await each(ctx, group, queue, [doc], False)
        if err is not None:
            raise err
        return {}

    async def batch(ctx: Ctx, doc: dict[str, Any]) -> dict[str, Any]:
        group, queue = _queue_of(ctx, doc)
        await _policy(ctx, group, queue)
        entries = _entries(doc, "Entries", kind)
        return _answer(entries, await each(ctx, group, queue, entries, True))

    return single, batch


delete_message, delete_message_batch = _by_handle(_delete, "DeleteMessage")
change_message_visibility, change_message_visibility_batch = _by_handle(
    _change, "ChangeMessageVisibility")


ACTIONS = {
    "CreateQueue": create_queue, "GetQueueUrl": get_queue_url, "ListQueues": list_queues,
    "DeleteQueue": delete_queue, "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes, "SetQueueAttributes": set_queue_attributes,
    "TagQueue": tag_queue, "UntagQueue": untag_queue, "ListQueueTags": list_queue_tags,
    "SendMessage": send_message, "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message, "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "StartMessageMoveTask": start_message_move_task,
    "AddPermission": add_permission, "RemovePermission": remove_permission,
}
