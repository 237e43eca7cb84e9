"""Dropout in converted models: every family's attention dropout (GPT-2's attn_pdrop and resid_pdrop, BLOOM's
attention_dropout and hidden_dropout, GPT-NeoX's and every other attention_dropout) becomes softmax_attention's
``attn_dropout`` / ``out_dropout``, so a checkpoint shipped with dropout converts, its eval logits are the
original's, and in training the converted model drops the same entries as the original: on CPU both draw their
masks from torch's generator in the same order and shapes, so with one seed the training-mode logits agree to
the interop bound, in every mode of the converted mixers. The default ``GPT2Config()`` (dropout 0.1 everywhere,
as every released GPT-2 checkpoint) converts. Tiny random models (nothing downloaded)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from interop_helpers import INTEROP_RTOL, all_modes, ids, scale_err, set_mode  # noqa: E402
from seqmix.interop import from_transformers, seqmix_mixers  # noqa: E402
from test_interop_every_family import BUILDERS  # noqa: E402

#: config options of transformers' models that set a dropout probability (0.1 in these tests); the attention
#: modules' ones are read by the converter, the others act in transformers' own modules
DROPOUT_OPTIONS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "hidden_dropout", "embd_pdrop")
P = 0.1


def _with_dropout(family: str):
    """(the family's tiny model rebuilt with every dropout option of its config at P, same weights; the options set)."""
    m = BUILDERS[family]()
    cfg = m.config
    names = [n for n in DROPOUT_OPTIONS if hasattr(cfg, n)]
    for n in names:
        setattr(cfg, n, P)
    md = type(m)(cfg)
    md.load_state_dict(m.state_dict())
    return md.eval(), names


def _logits(model, x, seed: int | None = None):
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        return model(x, use_cache=False).logits


#: the families run by `-m "not slow"` (GPT-2 and BLOOM: the dropout inside the module on the output too)
QUICK = ("gpt2", "bloom", "gpt_neox", "llama")


@pytest.mark.parametrize("family", [f if f in QUICK else pytest.param(f, marks=pytest.mark.slow) for f in sorted(BUILDERS)])
def test_dropout_converts_and_falls_where_the_originals_does(family):
    """Eval: the converted model's logits are the original's. Training, one seed: the same logits, so the same
    entries are dropped (a draw per dropout, in the same order), in every mode of the converted mixers; the
    dropout acts (training differs from eval) and another seed draws other entries. A family without dropout
    options trains deterministically, converted or not."""
    m, names = _with_dropout(family)
    c = from_transformers(m)
    attention = {p: mx for p, mx in seqmix_mixers(c).items() if mx.registry_name == "softmax_attention"}
    for path, mx in attention.items():
        module = m.get_submodule(path)
        want = next((float(getattr(getattr(module, a), "p", getattr(module, a)))
                     for a in ("attention_dropout", "attn_dropout") if hasattr(module, a)), 0.0)
        assert mx.config.attn_dropout == want, (path, mx.config.attn_dropout, want)
    x = ids()
    ref = _logits(m, x)
    assert scale_err(_logits(c, x), ref) <= INTEROP_RTOL
    m.train()
    c.train()
    ref5, ref6 = _logits(m, x, seed=5), _logits(m, x, seed=6)
    for mode in all_modes(c):
        set_mode(c, mode)
        err = scale_err(_logits(c, x, seed=5), ref5)
        assert err <= INTEROP_RTOL, f"{family}, mode {mode}: training logits differ by {err:.3g} of their scale"
    if names:
        assert scale_err(ref5, ref) > 1e-2 and scale_err(ref6, ref5) > 1e-2  # the dropout acts, per seed
    else:
        assert torch.equal(ref6, ref5)


def test_the_default_gpt2_config_converts():
    """GPT2Config() as released checkpoints ship it (attn_pdrop = resid_pdrop = embd_pdrop = 0.1, 12 layers, d 768):
    converts; eval logits and greedy generation equal the original's; training with a seed equals too."""
    cfg = transformers.GPT2Config()
    assert (cfg.attn_pdrop, cfg.resid_pdrop) == (0.1, 0.1)
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    c = from_transformers(m)
    assert {(mx.config.attn_dropout, mx.config.out_dropout) for mx in seqmix_mixers(c).values()} == {(0.1, 0.1)}
    x = torch.randint(0, cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    assert scale_err(_logits(c, x), _logits(m, x)) <= INTEROP_RTOL
    kw = dict(max_new_tokens=4, do_sample=False, attention_mask=torch.ones_like(x), pad_token_id=0)
    assert torch.equal(c.generate(x, **kw), m.generate(x, **kw))
    m.train()
    c.train()
    assert scale_err(_logits(c, x, seed=3), _logits(m, x, seed=3)) <= INTEROP_RTOL
