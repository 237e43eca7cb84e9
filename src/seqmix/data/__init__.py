"""seqmix.data."""
