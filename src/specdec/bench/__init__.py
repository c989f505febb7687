"""Benchmarks: specdec against plain decoding and the peers a user would pick instead."""
