"""Types of the compiled copy core (src/lib.rs); spark_app.compiled_copy drives it."""

RangeIn = tuple[str, int, str, int, int, tuple[bool, int | None, int | None, int] | None]
Cursor = tuple[int, bool, bool, int]  # next, seen, done, first offset
Landed = tuple[int, int, int, int, int, list[list[int]], list[list[int]], list[int], float]
RefusedOut = tuple[int, int, int, bytes | None, bytes | None, int]  # range, offset, error code, key, value, timestamp

class Copier:
    def __init__(
        self,
        consumer_settings: list[tuple[str, str]],
        producer_settings: list[tuple[str, str]],
        source_alias: str,
        target_alias: str,
        identity: bool,
        stamp: bool,
        provenance_header: str,
        latency_bounds_ms: list[float],
        max_runs: int,
        idle_s: float | None,
        refusal_codes: list[int],
    ) -> None: ...
    def copy(
        self, ranges: list[RangeIn], flush_s: float, until_s: float | None = None
    ) -> tuple[list[tuple[Cursor, Landed]], tuple[str, int, int, str], list[RefusedOut], int]: ...
    def fatal(self) -> bool: ...
    def close(self) -> None: ...
