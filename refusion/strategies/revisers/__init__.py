"""Built-in revisers: ``none`` (every commit sealed at once) and ``wino`` (WINO's narrow-out re-masking)."""
