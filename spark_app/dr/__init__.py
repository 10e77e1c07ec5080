"""Disaster-recovery bookkeeping: offset syncs, MM2-format checkpoints, group offset sync, heartbeats, failover.

One job per module, each testable without a cluster (the Kafka side is injected):
- `formats`: MirrorMaker 2's wire formats (Checkpoint, OffsetSync, Heartbeat);
- `syncs`: the offset-sync store and translation;
- `internal`: the flow's internal topics on the clusters: where each lives, making them, reading them back;
- `lease`: one writer per flow's DR state (a newer mirror of the flow fences the older);
- `groups`: consumer groups' committed offsets, and commits that never overwrite a group in use;
- `offset_syncs`: recording where each batch landed, in the store and on the offset-syncs topic;
- `checkpoints`: the checkpoint task (translate selected groups, write checkpoints, sync groups);
- `heartbeats`: the heartbeat task (emit on the source, watch them arrive on the target);
- `service`: one flow's DR service, running those tasks beside the stream;
- `views`: what operators run: `status` and `failover`;
- `drill`: a DR drill of a running flow, with its own probe topic and group (RPO, RTO, re-read);
- `failback`: the failback steps a program can do: checks, then groups moved back to the primary;
- `adopt`: take a flow over from a stopped MirrorMaker 2;
- `handback`: the reverse, MirrorMaker 2 takes a flow over from the stopped mirror.

Offset syncs are written in MM2's OffsetSync format, but not under MM2's topic name. We name the topic
`mirrorkit-offset-syncs.<alias>.internal` (the flow's separator in place of the dots, as MM2 names its own since
KIP-690), after the other cluster's alias as MM2 does (the target's when it lives on the source, the source's when
on the target). Three reasons: nothing outside MM2's own connectors reads offset
syncs (RemoteClusterUtils reads checkpoints only), so MM2's name buys no interop; an MM2 running on the same
clusters, as during a migration or a side-by-side benchmark, would mix its syncs with ours under one key and
corrupt both translations; and the name stays internal (never mirrored) under both tools' rules.
"""
