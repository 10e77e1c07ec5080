"""Files beside the Spark checkpoint: a local folder from Python, a Hadoop file system through Spark's JVM, and the
ledger's state file as the previous release wrote it."""

from __future__ import annotations

import json

from spark_app.ledger import STATE_FILE, LedgerState
from spark_app.quarantine import Hold, Quarantine
from spark_app.storage import HadoopFiles, LocalFiles, checkpoint_files

# The state file exactly as the previous mirror version wrote it (json.dumps(raw, indent=1), version 1).
PREVIOUS_VERSION_STATE = """{
 "version": 1,
 "quarantined": {
  "orders": {
   "reason": "event hub 'onprem.orders' does not exist on 'dr'",
   "partitions": {
    "0": {
     "first": 5,
     "next": 11
    }
   }
  }
 },
 "positions": {
  "orders": {
   "0": 11,
   "1": 7
  }
 },
 "adopted": {}
}"""
# Keys a newer mirror adds, with what they are for a state written before them (an older mirror ignores them).
ADDED_SINCE = {"landed": {}, "mode": "throughput", "slots": 0, "topic_ids": {}, "unresolved": {}}


def test_a_local_location_with_or_without_file_scheme_is_a_folder_replaced_file_by_file(tmp_path):
    for location in (str(tmp_path / "a"), f"file:{tmp_path / 'a'}", f"file://{tmp_path / 'a'}"):
        files = checkpoint_files(location)
        assert isinstance(files, LocalFiles) and files.local and files.folder == tmp_path / "a"
    files = checkpoint_files(str(tmp_path / "a"))
    assert files.read("x") is None and files.names("offsets") == []
    files.write("x", b"one")
    files.write("x", b"two")
    assert files.read("x") == b"two" and [p.name for p in (tmp_path / "a").iterdir()] == ["x"]
    (tmp_path / "a" / "offsets").mkdir()
    assert files.names("offsets") == []
    files.write("offsets/0", b"v1")  # its folder made on the way
    assert files.names("offsets") == ["0"] and files.read("offsets/0") == b"v1"
    files.delete("offsets/0")
    files.delete("offsets/0")  # gone already: nothing to do
    assert files.names("offsets") == []


def test_the_previous_versions_local_state_file_is_read_as_it_is(tmp_path):
    (tmp_path / STATE_FILE).write_text(PREVIOUS_VERSION_STATE)
    state = LedgerState.load(checkpoint_files(str(tmp_path)))
    reason = "event hub 'onprem.orders' does not exist on 'dr'"
    assert state.quarantined == {"orders": Quarantine(reason, {0: Hold(5, 11)})}
    assert state.positions == {("orders", 0): 11, ("orders", 1): 7}
    state.save()
    assert json.loads((tmp_path / STATE_FILE).read_text()) == json.loads(PREVIOUS_VERSION_STATE) | ADDED_SINCE


def test_a_hadoop_file_system_without_abortable_streams_replaces_a_file_by_rename(spark, tmp_path):
    files = HadoopFiles(f"file://{tmp_path}/ckpt", spark)
    assert files.read(STATE_FILE) is None and files.names("offsets") == []
    state = LedgerState.load(files)
    state.quarantined["orders"] = Quarantine("too big", {3: Hold(7, 9)})
    state.save()
    state.quarantined["orders"].partitions[3].next = 10
    state.save()
    assert LedgerState.load(files).quarantined == {"orders": Quarantine("too big", {3: Hold(7, 10)})}
    assert files.where(STATE_FILE) == f"file:{tmp_path}/ckpt/{STATE_FILE}"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.endswith(".crc")) == [STATE_FILE]
    files.write("offsets/0", b"v1")
    assert [n for n in files.names("offsets") if not n.endswith(".crc")] == ["0"]
    files.delete("offsets/0")
    files.delete("offsets/0")  # gone already: nothing to do
    assert files.names("offsets") == []
