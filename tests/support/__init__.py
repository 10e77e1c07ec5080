"""The real-broker test bed: Kafka clusters on loopback, their TLS material and client settings."""
