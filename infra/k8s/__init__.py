"""Kubernetes pieces: the mirror's namespace, the Spark Operator and the mirror itself."""
