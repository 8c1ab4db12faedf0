"""The effects of the sans-I/O protocol core, and the one retry policy.

Every verb of the client is a generator (see ``_protocol.py``) that *yields* effects and
receives their results; it never touches a socket or a clock. The two drivers
(``_syncdriver.py`` over ``httpx.Client``, ``_async.py`` over ``httpx.AsyncClient``) interpret
them::

    Call(...)   -> the parsed JSON answer, or a Reply (raw=True / stream=True);
                   a failure is thrown *into* the generator as a squall error
    Sleep(s)    -> None, after s seconds
    Read(reply) -> the next chunk of a streamed answer (b"" at its end)
    Close(reply)-> None (drivers also close every stream a verb left open)
    Emit(value) -> None; the value goes to the caller of a streaming verb
                   (``iter_payload``, ``iter_tasks``)
    Gather(gens)-> the results of these verbs run at once (threads in the sync driver,
                   tasks in the async one), in order; the first failure once all ended
    Spawn(gen)  -> a handle; the verb runs in the background (a thread of the pool, a task)
    Join(handle)-> its result once it ended, or its failure thrown

Retries live here too (:func:`call`), as effects: a retryable failure becomes a ``Sleep``
and the same ``Call`` again, so both clients retry identically.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from squall.common.errors import (
    OutcomeUnknown,
    Overloaded,
    SquallError,
    StatusError,
    TransportError,
    Unavailable,
)

T = TypeVar("T")
log = logging.getLogger("squall.client")


@dataclass(slots=True)
class Call:
    """One HTTP request. `url` is a path on the master ("/v1/...") or an absolute data
    node URL. `idempotent`: safe to resend after an ambiguous failure (the request may
    have been applied). `retries`: override of the policy's attempts (0: never retry)."""

    method: str
    url: str
    json: Any = None
    content: bytes | Iterable[bytes] | None = None
    params: dict[str, str] | None = None
    headers: dict[str, str] | None = None
    timeout: float | None = None
    idempotent: bool = True
    raw: bool = False  # answer: Reply with the whole body, not parsed JSON
    stream: bool = False  # answer: Reply with an open stream (use Read / Close)
    retries: int | None = None
    attempt: int = 0  # set by call(): how many times it was resent
    slept: float = 0.0  # set by call(): seconds waited between its attempts


@dataclass(slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    content: bytes = b""
    stream: Any = None  # the driver's handle of an open stream


@dataclass(slots=True)
class Gather:
    """Run these protocol generators at once; their results in order, or the first failure
    once every one of them has ended (what the others did stands)."""

    gens: list[Generator[Any, Any, Any]]


@dataclass(slots=True)
class Spawn:
    """Start this protocol generator in the background; the answer is a handle to Join."""

    gen: Generator[Any, Any, Any]


@dataclass(slots=True)
class Join:
    """Wait for a spawned generator: its result, or its failure thrown."""

    handle: Any


@dataclass(slots=True)
class Sleep:
    secs: float


@dataclass(slots=True)
class Read:
    reply: Reply


@dataclass(slots=True)
class Close:
    reply: Reply


@dataclass(slots=True)
class Emit:
    value: Any


Effect = Call | Sleep | Read | Close | Emit | Gather | Spawn | Join
Proto = Generator[Effect, Any, T]


class ConnectError(TransportError):
    """The connection could not be made: the request was never sent (always safe to
    retry, even when not idempotent)."""


def may_have_applied(err: SquallError) -> bool:
    """Whether a failed call may still have been applied: its connection broke or timed
    out after sending, or a server answered 500 or an unknown outcome (502/504, e.g. a
    data node's front door that lost the master's answer). Every other error (a
    connection never made, 4xx, 503, 507) means nothing was applied."""
    if isinstance(err, TransportError):
        return not isinstance(err, ConnectError)
    return isinstance(err, StatusError) and err.status in (500, 502, 504)


def lost_answer(err: SquallError, earlier: str) -> OutcomeUnknown:
    """The error for a call whose last attempt was refused (`err`, which would claim that
    nothing was applied) after an earlier attempt that may have been (`earlier`: what
    happened to it; a message, not the exception, whose traceback would hold the call's
    frame in a reference cycle, and the responses its frames hold). Raised from `err`
    without naming it in the frame, for the same reason."""
    return OutcomeUnknown(f"{err} (but an earlier attempt may have been applied: its "
                          f"answer was lost: {earlier}); resending an enqueue is safe")


@dataclass(slots=True)
class Retry:
    """Retries with exponential backoff and jitter (each wait between half and all of
    ``min(max_s, base_s * 2**n)``), bounded by ``attempts`` resends and ``budget_s``
    seconds of waiting in all, whichever ends first. The defaults ride out a master
    restart (1-15 s here): about 30 s of waiting.

    Retried: a connection that could not be made (the request was never sent), 503 and
    429 (the server refused before applying anything; ``Retry-After`` is honoured), and,
    for idempotent calls only, any other transport failure (a timeout or a connection
    lost after sending: the request may or may not have been applied). Enqueues are
    idempotent (client-made pids collapse a resend); leases, dequeues and releases are not.
    """

    attempts: int = 30  # resends after the first try
    base_s: float = 0.05
    max_s: float = 2.0
    retry_after_max_s: float = 10.0
    budget_s: float = 30.0  # seconds of waiting between attempts, in all
    rng: random.Random = field(default_factory=random.Random)
    waiting: bool = False  # said (once) that a server cannot be reached; reset by an answer

    def delay(self, err: SquallError, attempt: int, idempotent: bool,
              attempts: int | None = None) -> float | None:
        """Seconds to wait before resend number `attempt` + 1, or None: give up."""
        if attempt >= (self.attempts if attempts is None else attempts):
            return None
        if isinstance(err, Unavailable | Overloaded):
            if err.retry_after:
                return min(float(err.retry_after), self.retry_after_max_s)
        elif not (isinstance(err, ConnectError)
                  or (idempotent and isinstance(err, TransportError | OutcomeUnknown))):
            return None
        cap: float = min(self.max_s, self.base_s * (2 ** attempt))
        return cap / 2 + self.rng.random() * cap / 2


def call(c: Call, retry: Retry) -> Proto[Any]:
    """Send `c`, resending it per `retry`; the answer, or the last error raised (as an
    OutcomeUnknown when it is a refusal after an attempt that may have been applied)."""
    earlier: str | None = None  # an attempt that may have been applied
    while True:
        try:
            answer = yield c
            retry.waiting = False
            return answer
        except SquallError as e:
            if c.content is not None and not isinstance(c.content, bytes | bytearray):
                raise  # a streamed body is consumed: it cannot be sent again
            d = retry.delay(e, c.attempt, c.idempotent, c.retries)
            if d is None or c.slept + d > retry.budget_s:
                if earlier is None or may_have_applied(e):
                    raise
                raise lost_answer(e, earlier) from e
            if may_have_applied(e):
                earlier = earlier or f"{type(e).__name__}: {e}"
            if isinstance(e, ConnectError) and not retry.waiting:
                # never silent: one line per outage on the squall.client logger (printed
                # on stderr where logging is not configured)
                retry.waiting = True
                log.warning("%s; retrying: at most %d times, %.0f s of waiting in all "
                            "(Client(retries=, retry_budget_s=))", e,
                            retry.attempts if c.retries is None else c.retries, retry.budget_s)
            c.attempt += 1
            c.slept += d
            yield Sleep(d)
