"""The local demo: an MSK-like source and an Event Hubs-like target on loopback.

The mirror has not landed yet, so the demo brings the two clusters up, shows how to reach them, proves each
takes traffic, and says so. Run it with `bash .ci/demo`.
"""

from __future__ import annotations

import argparse

from .clients import Record, create_topics, produce, read_all
from .kafka_cluster import ListenerKind
from .testbed import TestBed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hold", action="store_true", help="keep the clusters up until Ctrl-C")
    args = parser.parse_args()

    bed = TestBed()
    try:
        source = bed.start("msk-demo", ListenerKind.MSK_SCRAM)
        target = bed.start("eventhubs-demo", ListenerKind.EVENTHUBS)
        for cluster in (source, target):
            settings = cluster.client
            print(
                f"{cluster.name:15} {cluster.kind.value:10} {settings.bootstrap:22} {settings.security_protocol}"
                f" {settings.sasl_mechanism}  started in {cluster.started_in_s:.1f}s"
            )
            create_topics(cluster.admin, {"demo.orders": 4})
            records = [Record(i % 4, f"k{i}".encode(), f"order {i}".encode()) for i in range(100)]
            produce(settings, "demo.orders", records)
            print(f"{'':15} wrote and read back {len(read_all(settings, 'demo.orders', expected=100))} records")
        print("The mirror is not part of this build yet: the demo stops at two live clusters.")
        if args.hold:
            print("Holding the clusters up; Ctrl-C to stop.")
            try:
                while True:
                    input()
            except (KeyboardInterrupt, EOFError):
                pass
    finally:
        bed.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
