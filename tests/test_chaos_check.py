"""The fault checker's verdict on one partition, on histories written by hand: it must see every kind of failure it
exists to catch, or a green long run proves nothing."""

from __future__ import annotations

from bench.chaos.check import check_partition, reported_ahead, reported_losses


def v(i: int) -> bytes:
    return f"t:0:{i}".encode()


def verdict(source, target, acked=None, reported=(), remade=False):
    source_records = [(o, v(i)) for o, i in source]
    target_records = [(o, v(i)) for o, i in enumerate(target)]
    return check_partition("t", 0, source_records, target_records, acked or {}, reported, remade)[0]


def test_a_faithful_copy_passes_and_copies_past_the_first_are_duplicates_only():
    got = verdict([(0, 0), (1, 1), (2, 2)], [0, 1, 1, 2, 2])
    assert (got.lost, got.out_of_order, got.duplicates, got.silent_losses) == (0, 0, 2, 0)


def test_duplicates_are_named_as_runs_of_sequences_with_the_target_offsets_of_both_copies():
    """A long run that fails on duplicates says where they are: the records copied again, and where on the target."""
    got = verdict([(i, i) for i in range(10)], [*range(10), 3, 4, 5, 8, 9])
    assert got.duplicates == 5
    assert [str(run) for run in got.duplicate_runs] == [
        "sequences 3..5 copied first at target offsets 3..5, again at 10..12",
        "sequences 8..9 copied first at target offsets 8..9, again at 13..14",
    ]


def test_a_record_the_source_holds_that_the_target_lacks_is_lost():
    assert verdict([(0, 0), (1, 1), (2, 2)], [0, 2]).lost == 1


def test_first_copies_out_of_source_order_are_caught_though_a_later_copy_is_in_order():
    got = verdict([(0, 0), (1, 1), (2, 2)], [0, 2, 1, 2])
    assert got.out_of_order == 1 and got.lost == 0


def test_an_acknowledged_record_on_neither_side_is_silent_unless_the_mirror_reported_its_offset():
    acked = {v(0): 0, v(1): 1, v(2): 2, v(3): 3}
    silent = verdict([(3, 3)], [3], acked)
    assert silent.silent_losses == 3
    reported = verdict([(3, 3)], [3], acked, reported=[(0, 1)])
    assert (reported.deleted_unmirrored, reported.silent_losses) == (2, 1)
    assert verdict([(3, 3)], [3], acked, remade=True).silent_losses == 0, "the old life of a topic made again"


def test_on_a_topic_made_again_only_records_written_before_its_present_life_are_excused():
    """The present life holds records 3 and 5 (offsets 0 and 2); 4 was acknowledged at offset 1 of that life and is
    on neither side: a loss, though the topic was made again. 0..2 went with the earlier life."""
    acked = {v(0): 0, v(1): 1, v(2): 2, v(3): 0, v(4): 1, v(5): 2}
    got = verdict([(0, 3), (2, 5)], [3, 5], acked, remade=True)
    assert (got.deleted_unmirrored, got.silent_losses) == (3, 1)
    assert verdict([], [], {v(0): 0}, remade=True).silent_losses == 0, "a present life that holds nothing yet"


def test_a_reported_loss_that_is_on_the_target_is_counted_as_a_false_alarm_not_a_loss():
    acked = {v(0): 0, v(1): 1, v(2): 2}
    got = verdict([(2, 2)], [0, 2], acked, reported=[(0, 1)])
    assert (got.reported_but_copied, got.deleted_unmirrored, got.silent_losses, got.lost) == (1, 1, 0, 0)


def test_the_mirrors_loss_lines_are_read_back_per_partition():
    log = ("2026-11-27 ERROR spark_app.ledger: flow a->b: 57 record(s) of 'chaos-plain' partition 1, offsets 865..921,"
           " were deleted at the source before they were mirrored; mirroring goes on")  # fmt: skip
    assert reported_losses(log) == {("chaos-plain", 1): [(865, 921)]}


def test_first_copies_out_of_order_are_excused_only_inside_a_range_the_mirror_reported_as_landed_ahead():
    """Records 3..5 landed ahead of 2, which the target refused and the catch-up wrote after them (with 3..5 again):
    excused, and counted apart, only where the mirror reported them; a range that misses one leaves it a failure."""
    target = [0, 1, 3, 4, 5, 2, 3, 4, 5, 6]
    source = [(i, i) for i in range(7)]
    assert verdict(source, target).out_of_order == 3
    reported = check_partition("t", 0, [(o, v(i)) for o, i in source], [(o, v(i)) for o, i in enumerate(target)], {},
                               (), False, ahead=[(2, 3, 5)])[0]  # fmt: skip
    assert (reported.out_of_order, reported.reported_ahead, reported.lost) == (0, 3, 0)
    partly = check_partition("t", 0, [(o, v(i)) for o, i in source], [(o, v(i)) for o, i in enumerate(target)], {},
                             (), False, ahead=[(2, 3, 4)])[0]  # fmt: skip
    assert (partly.out_of_order, partly.reported_ahead) == (1, 2)


def test_the_mirrors_landed_ahead_lines_are_read_back_per_partition():
    log = ("2026-12-06 ERROR spark_app.ledger: flow a->b: 2999 record(s) of 'chaos-plain' partition 0, offsets"
           " 1001..3999, landed on the target ahead of offset 1000, which the target refused: their first copies"
           " there are out of source order")  # fmt: skip
    assert reported_ahead(log) == {("chaos-plain", 0): [(1000, 1001, 3999)]}


def test_a_range_reported_before_its_partition_went_backwards_excuses_nothing_of_the_life_after():
    """A range names source offsets of one life of the partition: once its offsets went backwards (a topic made again)
    only what was reported since counts, the new life's start read on unnoticed among it."""
    log = "\n".join([
        "ERROR flow a->b: 5 record(s) of 'remade' partition 0, offsets 10..14, landed on the target ahead of offset 9,"
        " which the target refused: their first copies there are out of source order",
        "ERROR flow a->b: 3 record(s) of 'remade' partition 1, offsets 1..3, landed on the target ahead of offset 0,"
        " which the target refused: their first copies there are out of source order",
        "ERROR flow a->b: offsets of 'remade' partition 0 went backwards (deleted and made again, or truncated): the"
        " mirror had copied up to offset 40, the partition now starts over at 0",
        "ERROR flow a->b: up to 15 record(s) of 'remade' partition 0, offsets 25..39, may have landed on the target"
        " ahead of offset 0, the start of the topic's new life: it was made again and read on unnoticed",
    ])  # fmt: skip
    assert reported_ahead(log) == {("remade", 0): [(0, 25, 39)], ("remade", 1): [(0, 1, 3)]}
