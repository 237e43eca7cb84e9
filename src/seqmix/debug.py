"""Debugging switches: where seqmix reads tensor values on the host.

seqmix checks its inputs' values (NaN and Inf, the sign of log-decays, β's range, ...) and picks
the one-tile chunk form where the decays allow it. Each of these reads a value on the host: free
on a CPU, where the computation is synchronous anyway, but on a GPU a read waits until every
queued kernel has run (the launch queue stalls once per read), ``torch.compile`` breaks its graph
at each one, and the ``meta`` device has no values to read. So the policy "auto" (the default)
reads values only from CPU tensors in eager mode; elsewhere the checks are skipped and the ops
take choices that need no value (the chunk form's tiles at a fixed size, exact at any decay).

    import seqmix.debug
    with seqmix.debug.host_reads("always"):   # a GPU run that checks every input, at a cost per call
        loss = model(x).sum()
    with seqmix.debug.host_reads("never"):    # a CPU run that takes the accelerator's paths
        y = mixer(x)

or for a whole process: ``SEQMIX_HOST_READS=always|never|auto``. A context wins over the
environment variable; contexts nest (the innermost wins). They are process-wide, not per thread.
"""

from __future__ import annotations

from contextlib import contextmanager

from ._checks import HOST_READ_POLICIES, HOST_READS_ENV, _policy_override, check_choice, host_read_policy, reads_values

__all__ = ["HOST_READS_ENV", "HOST_READ_POLICIES", "host_read_policy", "host_reads", "reads_values"]


@contextmanager
def host_reads(policy: str):
    """Within the block, the host-read policy is ``policy``: "auto", "always" or "never"."""
    check_choice("policy", policy, HOST_READ_POLICIES, "seqmix.debug.host_reads")
    _policy_override.append(policy)
    try:
        yield
    finally:
        _policy_override.pop()
