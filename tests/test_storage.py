"""Files beside the Spark checkpoint: a local folder from Python, a Hadoop file system through Spark's JVM, and the
flow state found where older mirrors left it."""

from __future__ import annotations

import json

from spark_app.quarantine import STATE_FILE, FlowState, Hold, Quarantine
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
ADDED_SINCE = {"landed": {}, "mode": "throughput"}


class RemoteFiles:
    """An object store in memory: what the mirror sees of `s3a://bucket/flow` through Hadoop."""

    local = False

    def __init__(self, location: str) -> None:
        self.location = location
        self.objects: dict[str, bytes] = {}

    def where(self, name: str) -> str:
        return f"{self.location}/{name}"

    def read(self, name: str) -> bytes | None:
        return self.objects.get(name)

    def write(self, name: str, data: bytes) -> None:
        self.objects[name] = data

    def has_entries(self, name: str) -> bool:
        return any(key.startswith(f"{name}/") for key in self.objects)


def test_a_local_location_with_or_without_file_scheme_is_a_folder_replaced_file_by_file(tmp_path):
    for location in (str(tmp_path / "a"), f"file:{tmp_path / 'a'}", f"file://{tmp_path / 'a'}"):
        files = checkpoint_files(location)
        assert isinstance(files, LocalFiles) and files.local and files.folder == tmp_path / "a"
    files = checkpoint_files(str(tmp_path / "a"))
    assert files.read("x") is None and not files.has_entries("offsets")
    files.write("x", b"one")
    files.write("x", b"two")
    assert files.read("x") == b"two" and [p.name for p in (tmp_path / "a").iterdir()] == ["x"]
    (tmp_path / "a" / "offsets").mkdir()
    assert not files.has_entries("offsets")
    (tmp_path / "a" / "offsets" / "0").write_text("v1")
    assert files.has_entries("offsets")


def test_the_previous_versions_local_state_file_is_read_as_it_is(tmp_path):
    (tmp_path / STATE_FILE).write_text(PREVIOUS_VERSION_STATE)
    state = FlowState.load(checkpoint_files(str(tmp_path)))
    reason = "event hub 'onprem.orders' does not exist on 'dr'"
    assert state.quarantined == {"orders": Quarantine(reason, {0: Hold(5, 11)})}
    assert state.positions == {("orders", 0): 11, ("orders", 1): 7}
    state.save()
    assert json.loads((tmp_path / STATE_FILE).read_text()) == json.loads(PREVIOUS_VERSION_STATE) | ADDED_SINCE


def test_state_an_older_mirror_wrote_under_a_relative_s3a_path_moves_into_the_bucket(tmp_path, monkeypatch):
    """Before object-storage support, `s3a://b/flow` became the local path `s3a:/b/flow` under the working folder."""
    monkeypatch.chdir(tmp_path)
    legacy = tmp_path / "s3a:" / "b" / "flow" / STATE_FILE
    legacy.parent.mkdir(parents=True)
    legacy.write_text(PREVIOUS_VERSION_STATE)
    remote = RemoteFiles("s3a://b/flow")
    state = FlowState.load(remote)
    assert state.quarantined["orders"].partitions == {0: Hold(5, 11)}
    assert json.loads(remote.objects[STATE_FILE]) == json.loads(PREVIOUS_VERSION_STATE) | ADDED_SINCE, "in the bucket"
    remote.objects[STATE_FILE] = remote.objects[STATE_FILE].replace(b'"next": 11', b'"next": 12')
    assert FlowState.load(remote).quarantined["orders"].partitions == {0: Hold(5, 12)}, "the bucket's copy wins"


def test_a_hadoop_file_system_without_abortable_streams_replaces_a_file_by_rename(spark, tmp_path):
    files = HadoopFiles(f"file://{tmp_path}/ckpt", spark)
    assert files.read(STATE_FILE) is None and not files.has_entries("offsets")
    state = FlowState.load(files)
    state.quarantined["orders"] = Quarantine("too big", {3: Hold(7, 9)})
    state.save()
    state.quarantined["orders"].partitions[3].next = 10
    state.save()
    assert FlowState.load(files).quarantined == {"orders": Quarantine("too big", {3: Hold(7, 10)})}
    assert files.where(STATE_FILE) == f"file:{tmp_path}/ckpt/{STATE_FILE}"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.endswith(".crc")) == [STATE_FILE]
    (tmp_path / "ckpt" / "offsets").mkdir()
    (tmp_path / "ckpt" / "offsets" / "0").write_text("v1")
    assert files.has_entries("offsets")
