"""What a target topic refuses that a record shows before it is sent: read from the topic's configs, and judged with
slack around the clock, so a record the broker would take is never held."""

from __future__ import annotations

import time

from spark_app.topics import TargetRule

NO_BOUND = str(2**63 - 1)


def now_ms() -> int:
    return int(time.time() * 1000)


def test_a_compacted_target_refuses_a_record_without_a_key_and_nothing_else_it_shows():
    rule = TargetRule.of({"cleanup.policy": "compact,delete", "message.timestamp.before.max.ms": NO_BOUND})
    assert rule == TargetRule(compacted=True)
    assert rule.refusal(None, now_ms()) == "it has no key and the target topic is compacted (INVALID_RECORD)"
    assert rule.refusal(b"", now_ms()) is None, "an empty key is a key"
    assert rule.refusal(b"k", 0) is None


def test_timestamps_are_refused_only_well_past_the_target_topics_bounds_and_never_under_log_append_time():
    rule = TargetRule.of({"cleanup.policy": "delete", "message.timestamp.before.max.ms": "86400000",
                          "message.timestamp.after.max.ms": "3600000"})  # fmt: skip
    assert rule is not None
    day, hour = 86_400_000, 3_600_000
    assert rule.refusal(None, now_ms()) is None
    assert rule.refusal(b"k", now_ms() - day + 1_000) is None, "inside the bound"
    assert rule.refusal(b"k", now_ms() - day - 30_000) is None, "near it: the broker's clock decides"
    assert "before.max.ms" in (rule.refusal(b"k", now_ms() - day - 120_000) or "")
    assert rule.refusal(b"k", now_ms() + hour + 30_000) is None
    assert "after.max.ms" in (rule.refusal(b"k", now_ms() + hour + 120_000) or "")
    stamped = {"message.timestamp.type": "LogAppendTime", "message.timestamp.before.max.ms": "1"}
    assert TargetRule.of(stamped) is None, "the broker stamps its own time: any timestamp goes"


def test_a_topic_that_refuses_nothing_a_record_shows_has_no_rule_so_the_copy_checks_nothing_per_record():
    assert TargetRule.of({}) is None
    defaults = {
        "cleanup.policy": "delete",
        "message.timestamp.type": "CreateTime",
        "message.timestamp.before.max.ms": NO_BOUND,
        "message.timestamp.after.max.ms": NO_BOUND,
    }
    assert TargetRule.of(defaults) is None
