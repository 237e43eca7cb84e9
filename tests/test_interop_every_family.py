"""`seqmix show --hf` and `seqmix show --hf --report` on a checkpoint of every family seqmix converts
(docs/interop.md): each tiny random model of the interop tests, saved with ``save_pretrained`` (nothing
downloaded), drawn and reported through the command; the report lists every converted layer with its seqmix
mixer, and names ALiBi (BLOOM) and MLA (DeepSeek-V3, Kimi-Linear) in the Λ column and GPT-OSS's sinks in
the normalization column. Beam search on every family: the converted model's beams are the original's, token
for token (every returned beam), where transformers runs beam search for the original."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import test_interop_attention as ATT  # noqa: E402
import test_interop_families as REC  # noqa: E402
import test_interop_frontier as FRONT  # noqa: E402
import test_interop_hybrids as HYB  # noqa: E402
import test_interop_show as SHOW  # noqa: E402
import test_interop_transformers as TT  # noqa: E402
from seqmix.analysis.model_maps import lambda_structure, norm_and_gate  # noqa: E402
from seqmix.cli import main  # noqa: E402
from seqmix.interop import from_transformers, seqmix_mixers, supported_families  # noqa: E402

#: config.model_type -> a tiny random model of that family (the interop tests' own builders)
BUILDERS = {
    **{f: (lambda f=f: SHOW.tiny(f, vocab=64)) for f in SHOW.FAMILIES},
    "rwkv": lambda: REC.tiny("rwkv"), "xlstm": lambda: REC.tiny("xlstm"),
    "llama": lambda: ATT.tiny("llama"), "recurrent_gemma": lambda: ATT.tiny("recurrent_gemma"),
    **{f: (lambda f=f: TT.tiny(f, attn=TT._attn(f))) for f in TT.FAMILIES if "_" not in f or f in ("gemma3_text", "qwen3_moe",
                                                                                                   "gpt_neox", "gpt_oss")},
    "deepseek_v3": lambda: TT.tiny("deepseek_v3"),
    **{f: (lambda f=f: HYB.tiny(f)) for f in ("bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "jamba", "zamba2")},
    **{f: (lambda f=f: FRONT.tiny(f)) for f in ("qwen3_next", "kimi_linear", "minimax", "lfm2")},
}

#: what the report must name, per family: (column, text)
NAMED = {"bloom": ("Λ structure", "ALiBi"), "deepseek_v3": ("Λ structure", "MLA"), "kimi_linear": ("Λ structure", "MLA"),
         "gpt_oss": ("normalization", "sink")}


def test_every_supported_family_has_a_tiny_model_here():
    assert set(BUILDERS) == set(supported_families())


def _table(md: str) -> list[dict]:
    """The rows of the report's Markdown table as {heading: cell}."""
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    head = [h.strip() for h in lines[0].strip("|").split(" | ")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split(" | ")), strict=True)) for ln in lines[1:]]


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_show_hf_and_the_report_work_for_every_family(family, tmp_path):
    m = BUILDERS[family]()
    assert m.config.model_type == family
    folder = tmp_path / family
    m.save_pretrained(folder)
    mixers = seqmix_mixers(from_transformers(m))
    ids = ",".join(str(i) for i in torch.randint(2, 60, (12,), generator=torch.Generator().manual_seed(0)).tolist())
    out = tmp_path / "show"
    assert main(["show", "--hf", str(folder), "--ids", ids, "--layers", "all", "--out", str(out), "--dpi", "20"]) == 0
    assert any(out.glob("*.png"))
    rep = tmp_path / "report"
    assert main(["show", "--hf", str(folder), "--ids", ids, "--report", "--out", str(rep)]) == 0
    rows = {r["module"]: r for r in _table((rep / "report.md").read_text(encoding="utf-8"))}
    for path, mx in mixers.items():
        r = rows[path]
        assert r["seqmix mixer"] == mx.registry_name, (path, r)
        assert r["Λ structure"] == lambda_structure(mx)
    if family in NAMED:
        column, text = NAMED[family]
        assert any(text in r[column] for r in rows.values()), (family, column, [r[column] for r in rows.values()])
        names = [lambda_structure(mx) if column == "Λ structure" else norm_and_gate(mx)[0] for mx in mixers.values()]
        assert any(text in n for n in names)


#: families whose transformers model refuses beam search with a cache (its state cannot be reordered): the
#: converted model (the same class) refuses it the same way
NO_BEAM_SEARCH = {"rwkv", "xlstm"}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_beam_search_gives_the_originals_beams(family):
    """3 beams, every beam returned with its score: the converted model's state follows transformers'
    reordering of the beams (every state kind), so its beams are the original's token for token."""
    m = BUILDERS[family]()
    c = from_transformers(m)
    prompt = torch.randint(2, 60, (2, 5), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=5, min_new_tokens=5, num_beams=3, num_return_sequences=3, do_sample=False,
              attention_mask=torch.ones_like(prompt), output_scores=True, return_dict_in_generate=True)
    if family in NO_BEAM_SEARCH:
        for model in (m, c):
            with pytest.raises(ValueError, match="beam search"):
                model.generate(prompt, **kw)
        return
    ref, out = m.generate(prompt, **kw), c.generate(prompt, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert len({tuple(s.tolist()) for s in ref.sequences[:3]}) == 3  # three different beams compared
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_a_converted_model_of_every_family_pickles(family):
    """A pickle round trip of a converted model (what torch.save(model) and a copy sent to a spawned process need):
    after a generate (the adapters' run-time records set), the loaded copy generates the same tokens and its logits
    equal the converted model's; the records themselves are not pickled."""
    import pickle

    torch.manual_seed(0)
    conv = from_transformers(BUILDERS[family]().eval())
    ids = torch.randint(2, 60, (1, 6), generator=torch.Generator().manual_seed(1))
    out = conv.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    loaded = pickle.loads(pickle.dumps(conv))  # (bytes made here, in memory)
    assert all(getattr(m, "_trust", None) is None for m in loaded.modules())
    assert torch.equal(loaded.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0), out)
    with torch.no_grad():
        assert torch.equal(loaded(out).logits, conv(out).logits)
