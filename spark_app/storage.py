"""Files in a flow's checkpoint folder, wherever it lives: a local path or a PVC, or object storage through Hadoop.

What the mirror must remember across a restart (a throughput flow's batch log, spark_app.batch_log, and the flow's
ledger, spark_app.ledger) lives in the flow's checkpoint folder (`checkpoint_location`), so it all survives together,
moves together, and goes when the folder is deleted. A
location with no scheme (or `file:`) is a local path, a PVC mounted as one included, and is written from Python
(temporary file, fsync, rename): no JVM needed, so `adopt` and the unit tests run without Spark. Any other scheme
(`s3a://`, `abfss://`, `hdfs://`) goes through the Hadoop `FileSystem` Spark itself uses for such a location, reached
through Spark's JVM: the same jars, the same `spark.hadoop.*` settings and credentials, nothing to set twice.

Why Hadoop rather than a compacted Kafka topic (measured with `bench/state_store.py`; docs/mirror/state.md): a topic
saves faster (0.9 ms against 20 ms on s3a, medians, moto on loopback), but both are small beside the offset and commit
entries the batch log writes per batch (Spark's own took 127 + 190 ms on s3a), so speed does not decide. State in a
topic outlives a checkpoint deleted to start over, and the two then disagree; a compacted topic is read whole at every
start (compaction never touches its active segment), so that read grows with the batches; and an Event Hubs cluster
would need one more pre-created hub per flow, on a tier with compaction.

Atomic replacement: a reader sees the old file or the new one, never a part. Where the file system's output streams
are abortable (`fs.capability.outputstream.abortable`: S3A, whose object appears only when its upload completes), the
file is written in place; elsewhere (local, HDFS) to a temporary file renamed over it with `FileContext`'s
`Rename.OVERWRITE`, as Spark's own checkpoint file manager does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pyspark import SparkContext

ABORTABLE = "fs.capability.outputstream.abortable"  # Hadoop's CommonPathCapabilities.ABORTABLE_STREAM


class CheckpointFiles(Protocol):
    """Small files in a checkpoint folder, by name."""

    location: str  # the checkpoint location as configured
    local: bool  # a local path (or PVC), not a Hadoop file system

    def where(self, name: str) -> str:
        """The file's full name, for messages."""
        ...

    def read(self, name: str) -> bytes | None:
        """The file's bytes, or None when there is no such file."""
        ...

    def write(self, name: str, data: bytes) -> None:
        """Replace the file whole, creating the folder if needed."""
        ...

    def names(self, folder: str) -> list[str]:
        """The names of the files in `folder`; none when there is no such folder."""
        ...

    def delete(self, name: str) -> None:
        """Delete the file, if there is one."""
        ...


def checkpoint_files(location: str, spark: SparkContext | None = None) -> CheckpointFiles:
    """The files at a checkpoint location. For a Hadoop location, `spark` is the Spark whose JVM and Hadoop settings
    to use (the running one, or a new one, when not given)."""
    parts = urlsplit(location)
    if parts.scheme == "file":
        return LocalFiles(location, Path(parts.path))
    if not parts.scheme:
        return LocalFiles(location, Path(location))
    return HadoopFiles(location, spark or _spark())


class LocalFiles:
    """A local folder; each write goes to a temporary file, is synced, then renamed over the old one."""

    local = True

    def __init__(self, location: str, folder: Path) -> None:
        self.location = location
        self.folder = folder

    def where(self, name: str) -> str:
        return str(self.folder / name)

    def read(self, name: str) -> bytes | None:
        try:
            return (self.folder / name).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with tmp.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)

    def names(self, folder: str) -> list[str]:
        path = self.folder / folder
        return [f.name for f in path.iterdir()] if path.is_dir() else []

    def delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)


class HadoopFiles:
    """A folder on any Hadoop file system, through Spark's JVM (Py4J)."""

    local = False

    def __init__(self, location: str, spark: SparkContext) -> None:
        context: Any = spark  # its JVM handles are private, untyped attributes
        self.location = location
        self._jvm = context._jvm
        self._gateway = context._gateway
        self._conf = context._jsc.hadoopConfiguration()
        self._root = self._jvm.org.apache.hadoop.fs.Path(location)
        self._fs = self._root.getFileSystem(self._conf)

    def _path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._root, name)

    def where(self, name: str) -> str:
        return str(self._path(name).toString())

    def read(self, name: str) -> bytes | None:
        try:
            stream = self._fs.open(self._path(name))
        except Exception as err:  # Py4JJavaError; only a missing file is an answer
            if _java_class(err) == "java.io.FileNotFoundException":
                return None
            raise
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def write(self, name: str, data: bytes) -> None:
        path = self._path(name)
        if self._fs.hasPathCapability(path, ABORTABLE):
            _write(self._fs, path, data, sync=False)  # the object appears whole when its upload completes, or never
            return
        folder, _, base = name.rpartition("/")
        tmp = self._path(f"{folder}/.{base}.tmp" if folder else f".{base}.tmp")
        _write(self._fs, tmp, data, sync=True)
        rename = self._jvm.org.apache.hadoop.fs.Options.Rename
        options = self._gateway.new_array(rename, 1)
        options[0] = rename.OVERWRITE
        self._jvm.org.apache.hadoop.fs.FileContext.getFileContext(self._fs.getUri(), self._conf).rename(
            tmp, path, options
        )

    def names(self, folder: str) -> list[str]:
        try:
            return [str(status.getPath().getName()) for status in self._fs.listStatus(self._path(folder))]
        except Exception as err:  # Py4JJavaError
            if _java_class(err) == "java.io.FileNotFoundException":
                return []
            raise

    def delete(self, name: str) -> None:
        self._fs.delete(self._path(name), False)


def _write(fs: Any, path: Any, data: bytes, sync: bool) -> None:
    """Create or overwrite `path`, synced to disk first when `sync` (object stores refuse hsync: their close is the
    commit). On failure an abortable stream is aborted, so no part of the data is published."""
    out = fs.create(path, True)
    try:
        out.write(bytearray(data))
        if sync:
            out.hsync()
    except BaseException:
        if out.hasCapability(ABORTABLE):
            out.abort()
        raise
    out.close()


def _java_class(err: Exception) -> str | None:
    """The Java exception class behind a Py4J error, if it is one."""
    java = getattr(err, "java_exception", None)
    return None if java is None else str(java.getClass().getName())


def _spark() -> SparkContext:
    """The running Spark, or a new one for a command that runs without a mirror (`adopt`)."""
    from pyspark import SparkConf, SparkContext

    return SparkContext.getOrCreate(SparkConf().setAppName("mirrorkit"))
