"""What only the tests need beside the shared test bed (bench.testbed): record assertions, mirror configs for test-bed
clusters, the Kubernetes API server, Spark standalone and the local demo."""
