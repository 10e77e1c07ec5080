"""Types of the compiled copy core (src/lib.rs); spark_app.compiled_copy drives it. Everything crosses by name: the
contract as JSON (spark_app.copy_wing.contract), ranges and results as dicts."""

from collections.abc import Callable
from typing import TypedDict

class RangeIn(TypedDict):
    topic: str  # the source topic
    partition: int
    target: str  # the target topic
    next: int
    stop: int

class Landed(TypedDict):
    """What landed of one range, each field by its spark_app.ranges.Landing name (`landing_fields()`)."""

    first_offset: int
    records: int
    bytes: int
    dropped: int
    last_offset: int
    last_target_offset: int
    runs: list[list[int]]
    echoes: list[list[int]]
    latency_counts: list[int]
    latency_sum_ms: float

class RangeOut(TypedDict):
    next: int
    seen: bool
    done: bool
    landing: Landed

class Stopped(TypedDict):
    kind: str  # "" when the copy did not stop at an event
    range: int
    offset: int
    detail: str

class RefusedOut(TypedDict):
    range: int
    offset: int
    code: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    timestamp: int

class Copied(TypedDict):
    ranges: list[RangeOut]
    stopped: Stopped
    refused: list[RefusedOut]
    undelivered: int

# A token login's callback, as confluent-kafka's `oauth_cb`: the cluster's sasl.oauthbearer.config in, the token and
# its expiry (seconds since the epoch) out, and optionally a principal.
TokenCallback = Callable[[str], tuple[str, float] | tuple[str, float, str]]

TxnError = tuple[int, str, bool, bool, bool] | None

class Copier:
    def __init__(
        self,
        consumer_settings: list[tuple[str, str]],
        producer_settings: list[tuple[str, str]],
        idle_s: float | None,
        consumer_token: TokenCallback | None = None,
        producer_token: TokenCallback | None = None,
    ) -> None: ...
    def copy(
        self, contract: str, ranges: list[RangeIn], flush_s: float, until_s: float | None = None,
        until_bytes: int | None = None,
    ) -> Copied: ...  # fmt: skip
    def fatal(self) -> bool: ...
    # The producer's transactions (its transactional.id comes with the producer settings): each returns None, or the
    # error as (code, reason, fatal, retriable, txn_requires_abort).
    def init_transactions(self, timeout_s: float) -> TxnError: ...
    def begin_transaction(self) -> TxnError: ...
    def send_offsets_to_transaction(
        self, positions: list[tuple[str, int, int, str | None]], group_metadata: bytes, timeout_s: float
    ) -> TxnError: ...
    def commit_transaction(self, timeout_s: float) -> TxnError: ...
    def abort_transaction(self, timeout_s: float) -> TxnError: ...
    def purge(self, in_queue: bool, in_flight: bool) -> None: ...
    def poll(self) -> None: ...
    def flush(self, timeout_s: float) -> int: ...
    def close(self) -> None: ...

def read_contract(contract: str) -> str: ...
def landing_fields() -> list[str]: ...
