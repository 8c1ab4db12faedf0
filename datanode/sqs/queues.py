"""SQS queues on squall's queues: names, URLs, ARNs, attributes (docs/sqs.md).

- A queue URL is ``<scheme>://<host>/<group>/<queue>``: the path names the squall group
  and queue, so any squall queue is addressable (``squall put jobs`` is
  ``.../default/jobs``). A queue *name* without a URL (CreateQueue, GetQueueUrl, ListQueues)
  is in the access key's group when it is limited to exactly one, else in ``default``
  (GetQueueUrl's ``QueueOwnerAWSAccountId`` names another group).
- The ARN is ``arn:aws:sqs:<region>:<group>:<queue>`` (the group stands where the account
  id does).
- Names: SQS allows 1-80 characters of ``A-Z a-z 0-9 _ -`` (``.fifo`` at the end of a FIFO
  queue's); squall names are 1-128 of ``A-Z a-z 0-9 _ . : -`` starting with a letter or a
  digit. An SQS name is its squall name as it is; SQS names starting with ``_`` or ``-``
  are refused (squall cannot hold them).
- Attributes are kept on the squall queue's policy: ``VisibilityTimeout`` is its
  ``lease_secs``, ``RedrivePolicy`` its ``max_attempts`` and ``dead_letter_queue`` (same
  group), the rest in its ``sqs`` map (stored and answered as given; ``DelaySeconds``,
  ``MaximumMessageSize`` and ``ReceiveMessageWaitTimeSeconds`` are applied by this
  endpoint), with the tags as ``tag:<key>`` entries.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any
from urllib.parse import urlsplit

import orjson

from squall.common.wire.names import NAME_RE
from squall.datanode.sqs.errors import SqsError, invalid

SQS_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
FIFO = ".fifo"
CATALOG = "sqs.catalog"  # a policy-only squall queue: the group's SQS-created queue names
CATALOG_MAX = 1000
LISTED, UNLISTED = "1", "0"  # a catalog entry: the queue exists / SQS deleted it
TAG = "tag:"
DELETED = "squall:DeletedTimestamp"  # DeleteQueue's mark (squall keeps a queue's counters)
MAX_TAGS = 50
DEFAULTS = {"DelaySeconds": "0", "MaximumMessageSize": "1048576",
            "MessageRetentionPeriod": "345600", "ReceiveMessageWaitTimeSeconds": "0",
            "VisibilityTimeout": "30", "SqsManagedSseEnabled": "false"}
FIFO_DEFAULTS = {"FifoQueue": "true", "ContentBasedDeduplication": "false",
                 "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
COUNTS = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
          "ApproximateNumberOfMessagesDelayed")
DERIVED = ("QueueArn", "CreatedTimestamp", "LastModifiedTimestamp", *COUNTS)
# attribute -> (low, high) for the numeric ones
RANGES = {"DelaySeconds": (0, 900), "MaximumMessageSize": (1024, 1048576),
          "MessageRetentionPeriod": (60, 1209600), "ReceiveMessageWaitTimeSeconds": (0, 20),
          "VisibilityTimeout": (0, 43200), "KmsDataKeyReusePeriodSeconds": (60, 86400)}
SETTABLE = {*RANGES, "Policy", "RedrivePolicy", "RedriveAllowPolicy", "KmsMasterKeyId",
            "SqsManagedSseEnabled", "ContentBasedDeduplication", "DeduplicationScope",
            "FifoThroughputLimit", "FifoQueue"}
ALL_NAMES = {*SETTABLE, *DERIVED}


def check_sqs_name(name: object) -> str:
    if not isinstance(name, str):
        raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
    base = name[:-len(FIFO)] if name.endswith(FIFO) else name
    if len(name) > 80 or not SQS_NAME_RE.fullmatch(base):
        raise invalid("Can only include alphanumeric characters, hyphens, or underscores. 1 "
                      "to 80 in length")
    if not NAME_RE.fullmatch(name):
        raise invalid(f"Queue name {name!r}: squall queue names start with a letter or a "
                      "digit (docs/sqs.md)")
    return name


def url_of(base: str, group: str, queue: str) -> str:
    return f"{base}/{group}/{queue}"


def parse_url(url: object) -> tuple[str, str]:
    """(group, queue) of a queue URL (any host: the endpoint that got it serves it)."""
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    try:
        path = urlsplit(url).path if "//" in url else url
    except ValueError:
        path = ""
    parts = path.strip("/").split("/")
    if len(parts) != 2 or not all(NAME_RE.fullmatch(p) for p in parts):
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    return parts[0], parts[1]


def arn_of(region: str, group: str, queue: str) -> str:
    return f"arn:aws:sqs:{region}:{group}:{queue}"


def parse_arn(arn: object) -> tuple[str, str]:
    """(group, queue) of an SQS ARN."""
    bits = arn.split(":") if isinstance(arn, str) else []
    if len(bits) != 6 or bits[:3] != ["arn", "aws", "sqs"] or not NAME_RE.fullmatch(
            bits[4]) or not NAME_RE.fullmatch(bits[5]):
        raise invalid(f"Invalid value for the parameter ARN: {str(arn)[:200]!r}")
    return bits[4], bits[5]


def check_attributes(attrs: object, fifo: bool, creating: bool) -> dict[str, str]:
    """Attributes as given, checked: InvalidAttributeName / InvalidAttributeValue."""
    if attrs is None:
        return {}
    if not isinstance(attrs, dict):
        raise invalid("Attributes must be a map of names to values")
    # SQS takes names with stray blanks ("VisibilityTimeout ")
    return {str(k).strip(): _check_value(str(k).strip(), v, fifo, creating)
            for k, v in attrs.items()}


def _check_value(k: str, v: object, fifo: bool, creating: bool) -> str:
    if k not in SETTABLE or (k in ("ContentBasedDeduplication", "DeduplicationScope",
                                   "FifoThroughputLimit") and not fifo):
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {k}.")
    if not isinstance(v, str) or len(v) > 20480:
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {k}.")
    if k in RANGES:
        lo, hi = RANGES[k]
        if not v.strip().lstrip("-").isdigit() or not lo <= int(v) <= hi:
            raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {k}. "
                           f"Reason: must be an integer from {lo} to {hi}.")
        return str(int(v))
    if k in ("FifoQueue", "ContentBasedDeduplication", "SqsManagedSseEnabled"):
        if v.lower() not in ("true", "false"):
            raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {k}.")
        v = v.lower()
    if k == "FifoQueue":
        if not creating:
            raise SqsError("InvalidAttributeName", "FifoQueue is set when a queue is created")
        if (v == "true") != fifo:
            raise invalid("The name of a FIFO queue can only "
                           "include alphanumeric characters, hyphens, or underscores, must "
                           "end with .fifo suffix and be 1 to 80 in length.")
    if k == "RedrivePolicy" and v:
        redrive(v)
        doc = orjson.loads(v)
        if not isinstance(doc["maxReceiveCount"], int):  # SQS answers it as a number
            v = orjson.dumps({"deadLetterTargetArn": doc["deadLetterTargetArn"],
                              "maxReceiveCount": int(doc["maxReceiveCount"])}).decode()
    return v


def redrive(text: str) -> tuple[str, str, int]:
    """(group, dead-letter queue, maxReceiveCount) of a RedrivePolicy."""
    try:
        doc = orjson.loads(text)
        n = int(doc["maxReceiveCount"])
        g, q = parse_arn(doc["deadLetterTargetArn"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, SqsError):
        raise SqsError("InvalidAttributeValue", "Value for parameter RedrivePolicy is "
                       "invalid. Reason: Redrive policy is not a dict or has no "
                       "deadLetterTargetArn and maxReceiveCount.") from None
    if not 1 <= n <= 1000:
        raise SqsError("InvalidAttributeValue", "Value for parameter RedrivePolicy is "
                       "invalid. Reason: maxReceiveCount must be 1-1000.")
    return g, q, n


def policy_with(policy: dict[str, Any], sqs: dict[str, str], group: str, queue: str
                ) -> dict[str, Any]:
    """The squall policy of a queue with these SQS attributes."""
    p = dict(policy)  # squall's own fields (flow control...) stay as they are
    if queue.endswith(FIFO):
        p["key_limit"] = 1  # one message of a message group in flight at a time
    if "VisibilityTimeout" in sqs:
        p["lease_secs"] = max(float(sqs["VisibilityTimeout"]), 0.001)
    if sqs.get("RedrivePolicy"):
        g, q, n = redrive(sqs["RedrivePolicy"])
        if g != group:
            raise SqsError("InvalidAttributeValue", "Value for parameter RedrivePolicy is "
                           "invalid. Reason: the dead-letter queue must be in the queue's "
                           "group (account id).")
        if q.endswith(FIFO) != queue.endswith(FIFO):
            raise SqsError("InvalidParameterValue", "Value for parameter RedrivePolicy is "
                           "invalid. Reason: The dead-letter queue of a FIFO queue must also "
                           "be a FIFO queue, and that of a standard queue a standard queue.")
        if q == queue:
            raise SqsError("InvalidAttributeValue", "Value for parameter RedrivePolicy is "
                           "invalid. Reason: a queue cannot be its own dead-letter queue.")
        p["max_attempts"], p["dead_letter_queue"] = n, q
    elif "RedrivePolicy" in sqs:  # set to "": no redrive
        p["max_attempts"] = p["dead_letter_queue"] = None
    p["sqs"] = sqs
    return p


def attributes(policy: dict[str, Any], group: str, queue: str, region: str,
               stats: dict[str, Any] | None) -> dict[str, str]:
    """Every attribute of a queue."""
    sqs = {k: v for k, v in (policy.get("sqs") or {}).items() if not k.startswith(TAG)}
    out = {**DEFAULTS, **(FIFO_DEFAULTS if queue.endswith(FIFO) else {})}
    if policy.get("lease_secs") is not None:
        out["VisibilityTimeout"] = str(int(policy["lease_secs"]))
    out.update(sqs)
    if policy.get("max_attempts") and not sqs.get("RedrivePolicy"):
        dlq = policy.get("dead_letter_queue") or queue + ".dead"
        out["RedrivePolicy"] = orjson.dumps({
            "deadLetterTargetArn": arn_of(region, group, dlq),
            "maxReceiveCount": policy["max_attempts"]}).decode()
    if not out.get("RedrivePolicy"):
        out.pop("RedrivePolicy", None)
    out["QueueArn"] = arn_of(region, group, queue)
    out.setdefault("CreatedTimestamp", "0")
    out.setdefault("LastModifiedTimestamp", out["CreatedTimestamp"])
    s = stats or {}
    out["ApproximateNumberOfMessages"] = str(s.get("available", 0))
    out["ApproximateNumberOfMessagesNotVisible"] = str(s.get("leased", 0))
    out["ApproximateNumberOfMessagesDelayed"] = str(s.get("delayed", 0))
    return out


def flow_key(group_id: str) -> str:
    """The squall flow-control key of a message group id (SQS allows 1-128 characters of
    any printable ASCII; a flow key is a squall name)."""
    if NAME_RE.fullmatch(group_id):
        return group_id
    return "sqs." + hashlib.sha256(group_id.encode()).hexdigest()[:40]


def tags(policy: dict[str, Any]) -> dict[str, str]:
    return {k[len(TAG):]: v for k, v in (policy.get("sqs") or {}).items() if k.startswith(TAG)}
