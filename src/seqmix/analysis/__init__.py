"""seqmix.analysis."""
