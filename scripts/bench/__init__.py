"""Helpers of the benchmark harness (``scripts/bench.py``): statistics, MCP clients, processes.

Not part of the product: nothing in ``reactor_fabric`` imports this package.
"""
