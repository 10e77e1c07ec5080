"""The copy wing: what chooses and constrains the copy cores.

Three cores copy records: the Python reference loop (spark_app.outbox), the Rust core in the Python worker
(spark_app.compiled_copy) and the Java copier on the executors' JVM (spark_app.realtime.jvm). `choice` picks the one
that copies a flow; `contract` is the per-record contract every core obeys, built once here from the flow, its
clusters and its target's rules, and handed to the Rust and Java cores as typed data they read by name.
"""
