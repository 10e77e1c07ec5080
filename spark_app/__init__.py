"""The mirror: a replacement for MirrorMaker 2 that runs on Spark."""
