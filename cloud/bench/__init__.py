"""Benchmarks: the tuning workflow (`edgespec bench`) and server capacity (`edgespec bench capacity`)."""
