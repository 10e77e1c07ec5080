"""The mirror: a Spark Structured Streaming replacement for MirrorMaker 2."""
