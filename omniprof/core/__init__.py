"""Core: options, profiler, results, registry."""
