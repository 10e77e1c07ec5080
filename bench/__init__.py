"""Benchmarks that decide design questions with measurements on real clusters."""
