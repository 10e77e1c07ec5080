"""The real parts on loopback that tests and benchmarks both run against: Kafka clusters, MirrorMaker 2, S3, clients."""
