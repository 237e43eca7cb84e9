"""seqmix.experiments."""
