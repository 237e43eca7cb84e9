"""Autoregressive generation for :class:`~seqmix.models.LanguageModel`, any mixer, any pattern.

    out = model.generate(input_ids, max_new_tokens=50, temperature=0.0)   # greedy
    out = model.generate(prompts, max_new_tokens=50, temperature=0.8, top_k=40, top_p=0.95, seed=0)

Prefill and decode
    The prompt goes through the model once, in each mixer's own full-sequence mode (``mode``
    "auto": chunkwise, parallel, FFT, ...), with a :class:`~seqmix.mixers.base.Cache`; each new
    token is then one call with T = 1, which every mixer runs in its "step" mode from the
    cache (O(1) state for recurrent mixers, a KV cache for attention, B'MOJO's memories).
    ``use_cache=False`` recomputes the full forward pass for every new token instead: the
    obviously-correct reference the tests compare the cached path with.

Prompts of different lengths (the mechanism, and why)
    A batch may hold prompts of different lengths, given either as a list of 1-D token
    sequences or as a left-padded [B, T] tensor with an ``attention_mask`` (1 = token,
    0 = padding, zeros only on the left: HuggingFace's convention). Rows are **grouped by
    prompt length**; each group is prefilled as one batch with its own Cache and decoded as
    one batch (:class:`RaggedState`). No padding token ever enters a mixer, and each row's
    positions start at 0, so the result is, by construction, what each prompt gives alone, for
    every mixer: a recurrent state, a convolution state, a KV cache or B'MOJO's memories need
    no padding mask, and learned positions need no per-row offsets. The price: a batch of G
    distinct lengths costs G mixer calls per decoded token (G = 1 for equal lengths).

Sampling
    ``temperature == 0`` is greedy (argmax); otherwise logits / temperature, then top-k (keep
    the k largest), then top-p (keep the smallest set of tokens whose probability reaches p,
    always at least one), then a draw from ``torch.Generator`` seeded with ``seed``. The draw
    for a batch is one ``torch.multinomial`` call, so sampled (not greedy) tokens depend on the
    batch they are drawn in.

Positions
    A model with a learned position table cannot go past ``max_seq_len`` tokens (prompt plus
    new tokens): :func:`generate` raises a ValueError before it starts. Recurrent mixers and
    models without positions have no such limit (Hyena's and S4's filters are built for
    ``l_max``: they raise their own error when the context passes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from ..mixers.base import Cache
from ..ops import states_in_place


@dataclass
class Group:
    """Rows of a batch that have consumed the same number of tokens (``pos``) and share a Cache."""

    rows: torch.Tensor  # [G] indices into the batch
    cache: Cache
    pos: int


class RaggedState:
    """The decoding state of a batch whose rows may sit at different positions.

    ``groups`` partition the batch rows; each holds a :class:`Cache` of its own rows (in the
    order of ``rows``) and the number of tokens they have consumed.
    """

    def __init__(self, batch_size: int, groups: list[Group]):
        self.batch_size = batch_size
        self.groups = groups

    @property
    def positions(self) -> torch.Tensor:
        """[B] tokens consumed by each row."""
        pos = torch.empty(self.batch_size, dtype=torch.long)
        for g in self.groups:
            pos[g.rows.cpu()] = g.pos
        return pos

    def max_pos(self) -> int:
        return max((g.pos for g in self.groups), default=0)

    def reorder_(self, index: torch.Tensor) -> "RaggedState":
        """Row j of the new batch continues old row ``index[j]`` (beam search; any index works:
        a group is split or dropped as needed). Uses :meth:`Cache.map_` with ``index_select``."""
        index = index.reshape(-1).long()
        where = {}  # old row -> (group number, position in the group)
        for gi, g in enumerate(self.groups):
            for local, r in enumerate(g.rows.tolist()):
                where[r] = (gi, local)
        new_groups = []
        for gi, g in enumerate(self.groups):
            new_rows = [j for j, r in enumerate(index.tolist()) if where[r][0] == gi]
            if not new_rows:
                continue
            local = torch.tensor([where[index[j].item()][1] for j in new_rows], device=g.rows.device)
            g.cache.map_(lambda t, local=local: t.index_select(0, local.to(t.device)))
            new_groups.append(Group(torch.tensor(new_rows, device=g.rows.device), g.cache, g.pos))
        self.groups = new_groups
        self.batch_size = int(index.numel())
        return self

    def floats(self) -> int:
        return sum(g.cache.floats() for g in self.groups)

    def nbytes(self) -> int:
        return sum(g.cache.nbytes() for g in self.groups)


# ------------------------------------------------------------------------------------------
# prompts
# ------------------------------------------------------------------------------------------


def prompt_lengths(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, where: str = "generate") -> torch.Tensor:
    """[B] number of real tokens of each left-padded row; checks the mask is left padding."""
    B, T = input_ids.shape
    if attention_mask is None:
        return torch.full((B,), T, dtype=torch.long)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = list(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"{where}: argument 'attention_mask' must have the shape of 'input_ids' {[B, T]}, got {shape}")
    m = attention_mask.detach().to("cpu", torch.long)
    if ((m != 0) & (m != 1)).any():
        raise ValueError(f"{where}: argument 'attention_mask' must hold only 0 (padding) and 1 (token)")
    lengths = m.sum(1)
    # left padding: every row is 0...0 1...1
    expected = (torch.arange(T).unsqueeze(0) >= (T - lengths).unsqueeze(1)).long()
    if not torch.equal(m, expected):
        raise ValueError(f"{where}: argument 'attention_mask' must be left padding (zeros, then ones, in every row); "
                         "right-padded or holed masks are not supported: pad on the left")
    if (lengths == 0).any():
        raise ValueError(f"{where}: argument 'attention_mask' has a row with no token (row {int((lengths == 0).nonzero()[0])})")
    return lengths


def left_pad(prompts: Sequence[Sequence[int]] | Sequence[torch.Tensor], pad_token_id: int = 0,
             where: str = "generate") -> tuple[torch.Tensor, torch.Tensor]:
    """A list of 1-D prompts -> (input_ids [B, T], attention_mask [B, T]), left-padded."""
    rows = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
    if not rows or any(r.numel() == 0 for r in rows):
        raise ValueError(f"{where}: argument 'input_ids' must hold at least one non-empty prompt")
    T = max(r.numel() for r in rows)
    ids = torch.full((len(rows), T), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - r.numel():] = r
        mask[i, T - r.numel():] = 1
    return ids, mask


def check_ids(model, input_ids: torch.Tensor, where: str) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        got = list(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"{where}: argument 'input_ids' must be a [batch, time] tensor of token ids (time >= 1) "
                         f"or a list of 1-D prompts, got {got}")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64, torch.int16, torch.uint8):
        raise ValueError(f"{where}: argument 'input_ids' must hold integer token ids, got dtype {input_ids.dtype}")
    V = model.config.vocab_size
    if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= V):
        raise ValueError(f"{where}: argument 'input_ids' holds ids outside [0, vocab_size = {V}): "
                         f"min {int(input_ids.min())}, max {int(input_ids.max())}")


def check_positions(model, total: int, where: str, arg: str = "max_new_tokens") -> None:
    """A learned position table bounds the context: a clear error before any work."""
    if model.pos is not None and total > model.pos.num_embeddings:
        raise ValueError(
            f"{where}: prompt plus '{arg}' reaches {total} tokens, past the model's learned position table "
            f"(max_seq_len = {model.pos.num_embeddings}); shorten the prompt or '{arg}', or use a model without "
            f"learned positions (positions='none': recurrent mixers need none)")


# ------------------------------------------------------------------------------------------
# prefill and step
# ------------------------------------------------------------------------------------------


def prefill(model, input_ids: torch.Tensor, lengths: torch.Tensor | None = None, *,
            last_only: bool = False) -> tuple[torch.Tensor, RaggedState]:
    """Runs the (left-padded) prompts through the model with fresh caches, one call per group
    of equal prompt length.

    input_ids: [B, T]; lengths: [B] real tokens of each row (right-aligned), default all T.
    Returns (logits [B, T, vocab] with 0 at padding positions, or [B, 1, vocab] with
    ``last_only``, and the state).
    """
    B, T = input_ids.shape
    lengths = torch.full((B,), T, dtype=torch.long) if lengths is None else lengths.cpu()
    logits = None
    groups = []
    for L in sorted(set(lengths.tolist()), reverse=True):
        rows = (lengths == L).nonzero().reshape(-1).to(input_ids.device)
        cache = Cache()
        h = model.hidden(input_ids[rows, T - L:], cache=cache, start=0)
        lg = model.head(h[:, -1:] if last_only else h)
        if logits is None:
            logits = lg.new_zeros(B, 1 if last_only else T, lg.shape[-1])
        logits[rows, logits.shape[1] - lg.shape[1]:] = lg
        groups.append(Group(rows, cache, int(L)))
    return logits, RaggedState(B, groups)


def extend(model, input_ids: torch.Tensor, state: RaggedState, *, last_only: bool = False) -> torch.Tensor:
    """Feeds n more tokens per row ([B, n]) through the state: [B, n, vocab] logits ([B, 1, vocab]
    with ``last_only``). n == 1 is a decoding step (each mixer's "step" mode)."""
    B, n = input_ids.shape
    if B != state.batch_size:
        raise ValueError(f"extend: argument 'input_ids' has {B} rows, the cache holds {state.batch_size}")
    out = None
    for g in state.groups:
        h = model.hidden(input_ids[g.rows], cache=g.cache, start=g.pos)
        lg = model.head(h[:, -1:] if last_only else h)
        if out is None:
            out = lg.new_empty(B, lg.shape[1], lg.shape[-1])
        out[g.rows] = lg
        g.pos += n
    return out


def step(model, tokens: torch.Tensor, state: RaggedState) -> torch.Tensor:
    """Feeds one token per row ([B] or [B, 1]) and returns the next-token logits [B, vocab]. The state's
    tensors are updated in place (:func:`seqmix.ops.states_in_place`: the decoding state is generate's)."""
    with states_in_place():
        return extend(model, tokens.reshape(-1, 1), state)[:, -1]


# ------------------------------------------------------------------------------------------
# sampling
# ------------------------------------------------------------------------------------------


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, where: str = "generate") -> None:
    if not isinstance(temperature, (int, float)) or temperature < 0 or temperature != temperature:
        raise ValueError(f"{where}: argument 'temperature' must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"{where}: argument 'top_k' must be a positive int or None, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"{where}: argument 'top_p' must be in (0, 1] or None, got {top_p!r}")


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Sets to -inf the logits outside the top-k set, then outside the top-p (nucleus) set. [B, V]."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens before it already reach p (the first one is always kept)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
               generator: torch.Generator | None) -> torch.Tensor:
    """[B, V] logits -> [B] token ids (greedy when temperature == 0)."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
    return torch.multinomial(probs.cpu() if generator is not None and generator.device.type == "cpu" else probs, 1,
                             generator=generator).reshape(-1).to(logits.device)


# ------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------


def stream(model, input_ids, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, seed: int | None = None, attention_mask: torch.Tensor | None = None,
           eos_token_id: int | None = None, pad_token_id: int | None = None, use_cache: bool = True,
           on_prefill: Callable[[RaggedState], None] | None = None, where: str = "generate") -> Iterator[torch.Tensor]:
    """Yields the new tokens [B] one step at a time (see :func:`generate` for the arguments).

    Rows that have produced ``eos_token_id`` yield ``pad_token_id`` (default: eos) afterwards;
    the stream stops when every row has finished or after ``max_new_tokens`` steps.
    """
    if not isinstance(input_ids, torch.Tensor):
        if attention_mask is not None:
            raise ValueError(f"{where}: argument 'attention_mask' goes with a [batch, time] tensor 'input_ids', not a list")
        input_ids, attention_mask = left_pad(input_ids, 0, where)
    check_ids(model, input_ids, where)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"{where}: argument 'max_new_tokens' must be an int >= 0, got {max_new_tokens!r}")
    check_sampling(temperature, top_k, top_p, where)
    V = model.config.vocab_size
    for name, tok in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        if tok is not None and (not isinstance(tok, int) or not 0 <= tok < V):
            raise ValueError(f"{where}: argument '{name}' must be a token id in [0, {V}), got {tok!r}")
    device = model.embed.weight.device
    input_ids = input_ids.to(device).long()
    lengths = prompt_lengths(input_ids, attention_mask, where)
    check_positions(model, int(lengths.max()) + max_new_tokens - 1 if max_new_tokens else int(lengths.max()), where)
    if max_new_tokens == 0:
        return
    pad = eos_token_id if pad_token_id is None else pad_token_id
    generator = None
    if seed is not None:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(int(seed))

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            B, T = input_ids.shape
            finished = torch.zeros(B, dtype=torch.bool, device=device)
            if use_cache:
                logits, state = prefill(model, input_ids, lengths, last_only=True)
                last = logits[:, -1]
                if on_prefill is not None:
                    on_prefill(state)
            else:
                rows = [input_ids[i, T - int(lengths[i]):] for i in range(B)]
                last = torch.stack([model(r.unsqueeze(0))[0, -1] for r in rows])
            for n in range(max_new_tokens):
                tok = next_token(last, temperature, top_k, top_p, generator)
                if eos_token_id is not None:
                    tok = torch.where(finished, torch.full_like(tok, pad), tok)
                    finished |= tok == eos_token_id
                yield tok
                if n == max_new_tokens - 1 or (eos_token_id is not None and bool(finished.all())):
                    return
                if use_cache:
                    last = step(model, tok, state)
                else:  # the reference: the whole sequence again, row by row (no padding anywhere)
                    rows = [torch.cat([r, t.reshape(1)]) for r, t in zip(rows, tok)]
                    last = torch.stack([model(r.unsqueeze(0))[0, -1] for r in rows])
    finally:
        model.train(was_training)


def generate(model, input_ids, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, attention_mask: torch.Tensor | None = None,
             eos_token_id: int | None = None, pad_token_id: int | None = None, use_cache: bool = True,
             callback: Callable[[torch.Tensor], None] | None = None,
             on_prefill: Callable[[RaggedState], None] | None = None) -> torch.Tensor:
    """Generates up to ``max_new_tokens`` tokens after each prompt.

    input_ids: [B, T] token ids (left-padded when ``attention_mask`` has zeros), or a list of
    1-D prompts of any lengths (left-padded with 0 here). temperature: 0 = greedy; top_k,
    top_p: filters before sampling; seed: seeds the sampling generator (None: torch's global
    one). eos_token_id: a row stops there (later positions hold ``pad_token_id``, default eos).
    use_cache: False recomputes the whole forward pass per token (the reference).
    callback: called with each step's new tokens [B] as they are produced (streaming).
    on_prefill: called once with the decoding state (:class:`RaggedState`) after the prefill; the object is
    updated in place as the tokens are decoded (its ``nbytes()`` at the end: the cache's final size).

    Returns [B, T + n] = the (padded) prompts followed by the n <= max_new_tokens new tokens.
    """
    if not isinstance(input_ids, torch.Tensor):
        input_ids, attention_mask = left_pad(input_ids, 0 if pad_token_id is None else pad_token_id)
    new = []
    for tok in stream(model, input_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                      attention_mask=attention_mask, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                      use_cache=use_cache, on_prefill=on_prefill):
        new.append(tok)
        if callback is not None:
            callback(tok)
    ids = input_ids.to(model.embed.weight.device).long()
    return torch.cat([ids, torch.stack(new, 1)], 1) if new else ids


__all__ = ["Group", "RaggedState", "filter_logits", "generate", "left_pad", "next_token", "prefill", "prompt_lengths",
           "step", "stream", "extend"]
