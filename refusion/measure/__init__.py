"""Measuring decodes: benchmarks against AR, the GPU cost model, traces, reproducible records, lm-eval."""
