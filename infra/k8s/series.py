"""The Prometheus series the mirror's driver serves (spark_app.metrics), which the alerts and the dashboard read.

Each has a `flow` label; the PodMonitor adds `app_kubernetes_io_instance`, the mirror's name.
"""

RECORDS_METRIC = "mirrorkit_records_mirrored_total"
LAG_METRIC = "mirrorkit_lag_records"
CHECKPOINT_AGE_METRIC = "mirrorkit_checkpoint_age_seconds"
HEARTBEAT_AGE_METRIC = "mirrorkit_heartbeat_age_seconds"
LAST_BATCH_METRIC = "mirrorkit_last_batch_timestamp_seconds"
ERRORS_METRIC = "mirrorkit_errors_total"
LATENCY_METRIC = "mirrorkit_replication_latency_seconds"  # a histogram: its _bucket series
QUARANTINED_METRIC = "mirrorkit_quarantined_topics"
DR_UNUSABLE_METRIC = "mirrorkit_dr_unusable_topics"
