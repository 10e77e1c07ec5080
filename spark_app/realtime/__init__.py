"""Real-time mode: long-running copier tasks (`task`), the Spark job that runs them and files their reports (`job`),
the report channel between them (`channel`), and the flow's runner (`flow`)."""
