"""Sequence classification and the dual encoder around the one backbone (LRA; dsf note §5.2,
metala note §6.7). The block stack is :class:`seqmix.models.lm.LanguageModel`'s: a
classifier holds a LanguageModel and reads its :meth:`~LanguageModel.hidden` states.

    inputs [B, T] (right-padded with pad_id)
      -> backbone.hidden                      [B, T, d]      (causal mixers: real positions never see the padding)
      -> pool over each row's real tokens     [B, d]         mean / last / cls (ClassifierConfig)
      (bidirectional: + the same on each row reversed within its length, by sum or concat)
      -> LRA head: Linear -> ReLU -> Linear   [B, classes]

    dual encoder (Retrieval): inputs [B, 2, T]; both documents through the same tower ->
    u, v [B, d_feat]; head on [u, v, u ⊙ v, u − v].

Padding. With right padding and causal mixers the hidden states at real positions do not
depend on what follows them, so only the pooling masks; the reversed pass reverses each row
within its own length (the padding stays on the right) and is pooled the same way. Hence the
same example gives the same logits with any amount of padding (tests/test_lra_models.py
checks it for every registered mixer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import reads_values
from .lm import LanguageModel, ModelConfig


def row_lengths(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """[B, T] right-padded ids -> [B] lengths; ValueError if a row is not right-padded or empty."""
    real = ids != pad_id
    lengths = real.sum(1)
    pos = torch.arange(ids.shape[1], device=ids.device)
    if reads_values(ids):  # both checks read the ids on the host (seqmix.debug)
        if not torch.equal(real, pos[None] < lengths[:, None]):
            raise ValueError(f"SequenceClassifier: argument 'inputs' must be right-padded with pad_id = {pad_id} "
                             "(no padding before a real token)")
        if bool((lengths == 0).any()):
            raise ValueError("SequenceClassifier: argument 'inputs' has an empty row (only padding)")
    return lengths


def reverse_rows(ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's first ``lengths[b]`` entries reversed, the padding left in place. [B, T] -> [B, T]."""
    t = torch.arange(ids.shape[1], device=ids.device)[None]
    idx = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return ids.gather(1, idx)


def pool(h: torch.Tensor, lengths: torch.Tensor, how: str) -> torch.Tensor:
    """[B, T, d] hidden states, [B] lengths -> [B, d]: the mean over positions < length, or
    the state at position length − 1 (``last``; ``cls`` reads the appended token there)."""
    if how == "mean":
        mask = (torch.arange(h.shape[1], device=h.device)[None] < lengths[:, None]).to(h.dtype)
        return (h * mask[..., None]).sum(1) / lengths[:, None].to(h.dtype)
    return h[torch.arange(h.shape[0], device=h.device), lengths - 1]


class SequenceClassifier(nn.Module):
    """The classifier of a :class:`ModelConfig` with ``classifier`` set (module docstring)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        cc = config.classifier
        if cc is None or cc.num_classes is None:
            raise ValueError("SequenceClassifier: config field 'classifier.num_classes' must be set (RunConfig fills it from the data)")
        if config.vocab_size is None:
            raise ValueError("SequenceClassifier: config field 'vocab_size' must be set (RunConfig fills it from the data)")
        self.config = config
        self.cc = cc
        extra = 1 if cc.pooling == "cls" else 0  # the CLS token: one more id and one more position
        bb = config.model_dump()
        bb.update(classifier=None, vocab_size=config.vocab_size + extra,
                  max_seq_len=None if config.max_seq_len is None else config.max_seq_len + extra)
        bb_config = ModelConfig(**bb)
        self.cls_id = config.vocab_size if extra else None
        self.backbone = LanguageModel(bb_config)
        two = cc.bidirectional != "none"
        self.backbone_rev = LanguageModel(bb_config) if two and cc.bidirectional_weights == "separate" else None
        d = config.d_model
        d_feat = 2 * d if cc.bidirectional == "concat" else d
        d_in = 4 * d_feat if cc.dual else d_feat
        hidden = cc.head_hidden or d
        self.head = nn.Sequential(nn.Dropout(cc.head_dropout), nn.Linear(d_in, hidden), nn.ReLU(),
                                  nn.Dropout(cc.head_dropout), nn.Linear(hidden, cc.num_classes))

    # -- the backbone's pieces, for the trainer (FLOPs, sizes) --------------------------

    @property
    def blocks(self):
        return self.backbone.blocks

    def state_size(self, seq_len: int | None = None) -> int:
        n = self.backbone.state_size(seq_len)
        return 2 * n if self.cc.bidirectional != "none" else n

    def num_params(self, *, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if not embeddings:
            for bb in (self.backbone, self.backbone_rev):
                if bb is not None:
                    n -= bb.embed.weight.numel() + (bb.pos.weight.numel() if bb.pos is not None else 0)
        return n

    # -- forward -----------------------------------------------------------------------

    def _pass(self, backbone: LanguageModel, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.cls_id is not None:  # the CLS token right after each row's last real token
            ids = F.pad(ids, (0, 1), value=self.cc.pad_id)
            ids = ids.scatter(1, lengths[:, None], self.cls_id)
            lengths = lengths + 1
        return pool(backbone.hidden(ids), lengths, self.cc.pooling)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """[B, T] right-padded ids -> [B, d] (concat: [B, 2d]) pooled features."""
        lengths = row_lengths(ids, self.cc.pad_id)
        u = self._pass(self.backbone, ids, lengths)
        if self.cc.bidirectional == "none":
            return u
        r = self._pass(self.backbone_rev or self.backbone, reverse_rows(ids, lengths), lengths)
        return u + r if self.cc.bidirectional == "sum" else torch.cat([u, r], -1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """[B, T] ids (dual: [B, 2, T]) -> logits [B, classes]."""
        if self.cc.dual:
            if inputs.dim() != 3 or inputs.shape[1] != 2:
                raise ValueError(f"SequenceClassifier (dual): argument 'inputs' must be [batch, 2, time], got {list(inputs.shape)}")
            B = inputs.shape[0]
            z = self.encode(inputs.reshape(2 * B, -1))
            u, v = z[:B], z[B:]
            return self.head(torch.cat([u, v, u * v, u - v], -1))
        if inputs.dim() != 2:
            raise ValueError(f"SequenceClassifier: argument 'inputs' must be [batch, time], got {list(inputs.shape)}")
        return self.head(self.encode(inputs))

    def scored_logits(self, inputs: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100):
        """(logits [B, classes], targets [B]): the trainer's interface (LanguageModel.scored_logits)."""
        if labels.dim() != 1 or labels.shape[0] != inputs.shape[0]:
            raise ValueError(f"SequenceClassifier: 'labels' must be [batch] class ids, got {list(labels.shape)} "
                             f"for inputs {list(inputs.shape)}")
        logits = self(inputs)
        keep = labels != ignore_index
        return logits[keep], labels[keep]
