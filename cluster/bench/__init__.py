"""The benchmark harness (`quorumgate bench`), its load generator and its baselines."""
