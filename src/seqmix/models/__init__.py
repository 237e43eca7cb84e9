"""seqmix.models."""
