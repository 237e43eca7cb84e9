"""seqmix.train."""
