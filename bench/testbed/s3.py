"""A real S3 API on loopback (moto's server mode) and the Spark settings that put a checkpoint there through s3a://.

The server starts once per test session on a free port. Spark reaches it with Hadoop's s3a connector from the jar
manifest's `cloud` group, the jars the mirror image bakes in, put on the driver's class path when its JVM starts
(`spark_env`), since a running session cannot take a file system's classes later. moto accepts any credentials; the
dummy ones below are for it only and go to Spark through the AWS SDK's environment variables, as a pod's would.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3

from images.fetch_jars import cached_jars

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "moto-only", "AWS_SECRET_ACCESS_KEY": "moto-only", "AWS_REGION": REGION}


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:<port>

    def client(self):  # boto3's client type is generated at run time
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id="moto-only", aws_secret_access_key="moto-only")  # fmt: skip

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def read(self, bucket: str, key: str) -> bytes | None:
        try:
            return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.client().exceptions.NoSuchKey:
            return None

    def spark_conf(self) -> dict[str, str]:
        """Spark settings for s3a:// on this server: the connector's jars and where the endpoint is."""
        jars = ":".join(str(j) for j in cached_jars("cloud"))
        s3a = {
            "endpoint": self.endpoint,
            "endpoint.region": REGION,
            "path.style.access": "true",
            "connection.ssl.enabled": "false",
        }
        return {"spark.driver.extraClassPath": jars} | {f"spark.hadoop.fs.s3a.{k}": v for k, v in s3a.items()}

    def spark_env(self) -> dict[str, str]:
        """Environment for a process that starts Spark from Python (`run` in a subprocess) with `spark_conf`."""
        submit = [arg for k, v in self.spark_conf().items() for arg in ("--conf", f"{k}={v}")]
        return CREDENTIALS | {"PYSPARK_SUBMIT_ARGS": shlex.join([*submit, "pyspark-shell"])}


@contextmanager
def moto_server(folder: Path, port: int, timeout_s: float = 60.0) -> Iterator[S3Server]:
    """moto's S3 on 127.0.0.1:`port` until the block ends; its log goes to `folder`."""
    endpoint = f"http://127.0.0.1:{port}"
    server = Path(sys.executable).parent / "moto_server"
    if not server.exists():
        raise FileNotFoundError(f"{server} is missing; install the test extras with .ci/setup (moto[server])")
    with (folder / "moto.log").open("w") as log:
        proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, env=os.environ | CREDENTIALS)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError as err:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not answer on {endpoint}; see {folder / 'moto.log'}") from err
                time.sleep(0.2)
        yield S3Server(endpoint)
    finally:
        proc.terminate()
        proc.wait(30)
