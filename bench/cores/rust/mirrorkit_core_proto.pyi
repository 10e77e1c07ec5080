"""Types of the prototype Rust copy core (src/lib.rs), which maturin ships beside the compiled module."""

def copy_ranges(
    source_bootstrap: str, target_bootstrap: str, ranges: list[tuple[str, int, int, int]], target_prefix: str
) -> list[tuple[str, int, int, int, int]]:
    """Copy each (topic, partition, start, end) range [start, end) to `<target_prefix><topic>`, same partition;
    per range (topic, partition, records landed, first target offset, last target offset), -1 for none."""
