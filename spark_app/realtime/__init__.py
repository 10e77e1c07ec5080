"""Real-time mode: long-running copier tasks (`task`), the Spark job and report channel that run them (`job`), and
the flow's runner (`flow`)."""
