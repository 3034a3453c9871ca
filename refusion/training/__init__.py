"""Training a ReFusion model: the objective, a synthetic task suite, a character tokenizer, a CPU trainer."""
