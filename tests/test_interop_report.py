"""`seqmix show --hf X --report` (docs/interop.md): the layer report of a converted
model — every layer's transformers class, seqmix mixer (or "kept"), state size, Λ structure, norms
and gates, decay range and 90% mass lag of Φ on the text — checked against values computed
directly: the mixers' own state_size, decays(x) and phi(x), the lag measure on hand-made maps.
Tiny random transformers models (nothing downloaded): Mamba, Llama, Qwen3-Next, LFM2, Kimi-Linear (its
MLA converted; and, for a family that keeps a module as transformers' own, the same model with its MLA
kept: ``Family.keeps``)."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

import seqmix  # noqa: E402
import test_interop_attention as ATT  # noqa: E402
import test_interop_frontier as FRONT  # noqa: E402
import test_interop_show as SHOW  # noqa: E402
from seqmix.analysis.model_maps import (  # noqa: E402
    LAMBDA_STRUCTURE, REPORT_COLUMNS, default_heads, lambda_structure, layer_inputs, layer_lag, layer_report, map_pieces, mass_lag,
    report_html, report_markdown,
)
from seqmix.cli import main  # noqa: E402
from seqmix.interop import from_transformers, seqmix_mixers  # noqa: E402

KINDS = ("scalar", "diagonal", "diagonal + low rank", "product", "dense", "shift", "identity", "none")


def brute_lag(phi: torch.Tensor, q: float = 0.9) -> float:
    """The definition, one row at a time: mean over rows i with mass of the smallest L >= 1 with
    Σ_(i-L < j <= i) |Φ_ij| >= q Σ_(j <= i) |Φ_ij|."""
    T = phi.shape[-1]
    Ls = []
    for i in range(T):
        row = phi[i, : i + 1].abs().double()
        total = float(row.sum())
        if total == 0:
            continue
        for L in range(1, i + 2):
            if float(row[i - L + 1:].sum()) >= q * total * (1 - 1e-12):
                Ls.append(L)
                break
    return sum(Ls) / max(1, len(Ls))


def test_every_registered_mixer_has_a_lambda_structure():
    names = [e.name for e in seqmix.list_mixers()]
    missing = [n for n in names if n not in LAMBDA_STRUCTURE]
    assert not missing, f"add these mixers to analysis.model_maps.LAMBDA_STRUCTURE: {missing}"
    for n, s in LAMBDA_STRUCTURE.items():
        assert s.split(":")[0].split(" (")[0] in KINDS, (n, s)
    # the table agrees with the classes' own flags
    for e in seqmix.list_mixers():
        s = LAMBDA_STRUCTURE[e.name]
        if not e.cls.finite_state:
            assert s.startswith("none"), e.name
        if s.startswith(("product", "dense", "shift")):
            assert not e.cls.diagonal_transition, e.name


def test_mass_lag_on_hand_made_maps():
    T = 12
    assert torch.allclose(mass_lag(torch.eye(T)), torch.tensor(1.0, dtype=torch.float64))
    uniform = torch.ones(T, T).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)  # averaging attention: row i needs ceil(0.9 (i + 1)) tokens
    want = sum(math.ceil(0.9 * (i + 1) - 1e-9) for i in range(T)) / T
    assert float(mass_lag(uniform)) == pytest.approx(want)
    shift = torch.diag(torch.ones(T - 3), -3)  # all mass 3 tokens back: L = 4 on the rows that have mass
    assert float(mass_lag(shift)) == pytest.approx(4.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        phi = torch.randn(T, T, generator=g).tril() * torch.rand(T, 1, generator=g)
        assert float(mass_lag(phi)) == pytest.approx(brute_lag(phi))
    batch = torch.stack([torch.eye(T), uniform])
    assert mass_lag(batch).tolist() == pytest.approx([1.0, want])


def _kept_family(monkeypatch):
    """Kimi-Linear as a family that keeps its MLA as transformers' own (``Family.keeps``)."""
    import dataclasses

    from seqmix.interop import FAMILIES

    fam = FAMILIES["kimi_linear"]
    mla = next(mm for mm in fam.modules if mm.class_name == "KimiLinearAttention")
    kept = dataclasses.replace(fam, modules=tuple(mm for mm in fam.modules if mm is not mla), keeps=(mla.module,))
    monkeypatch.setitem(FAMILIES, "kimi_linear", kept)


def _converted(case: str, monkeypatch=None):
    if case == "kimi_linear_kept":
        _kept_family(monkeypatch)
        return from_transformers(FRONT.tiny("kimi_linear"))
    if case == "mamba":
        return from_transformers(SHOW.tiny("mamba", vocab=64))
    if case == "llama":
        return from_transformers(ATT.tiny("llama"))
    return from_transformers(FRONT.tiny(case))


def test_the_blocked_lag_equals_the_lag_of_the_mixers_own_maps():
    conv = _converted("mamba")
    ids = torch.randint(2, 64, (20,), generator=torch.Generator().manual_seed(3))
    xs = layer_inputs(conv, ids)
    for path, mixer in seqmix_mixers(conv).items():
        x = xs[path + ".mixer"]
        assert map_pieces(mixer, x) is not None  # the blocked path
        phi = mixer.phi(x)[0].detach().float()
        want = float(mass_lag(phi).mean())
        got = layer_lag(mixer, x, block_bytes=3 * 8 * 20 * 20)  # 3 maps per block: many blocks
        assert got == pytest.approx(want, rel=1e-5)
        pick = default_heads(phi.shape[0], 5)  # a layer with more maps than max_maps: evenly spaced ones
        assert layer_lag(mixer, x, max_maps=5) == pytest.approx(float(mass_lag(phi[pick]).mean()), rel=1e-5)


#: the mixer of each layer, the transformers class and the Λ kind
EXPECTED = {
    "mamba": [("backbone.layers.0.mixer", "MambaMixer", "mamba", "diagonal"),
              ("backbone.layers.1.mixer", "MambaMixer", "mamba", "diagonal")],
    "llama": [("model.layers.0.self_attn", "LlamaAttention", "softmax_attention", "none"),
              ("model.layers.1.self_attn", "LlamaAttention", "softmax_attention", "none")],
    "qwen3_next": [("model.layers.0.linear_attn", "Qwen3NextGatedDeltaNet", "qwen3_next_gdn", "product"),
                   ("model.layers.1.self_attn", "Qwen3NextAttention", "softmax_attention", "none"),
                   ("model.layers.2.linear_attn", "Qwen3NextGatedDeltaNet", "qwen3_next_gdn", "product"),
                   ("model.layers.3.self_attn", "Qwen3NextAttention", "softmax_attention", "none")],
    "lfm2": [("model.layers.0.conv", "Lfm2ShortConv", "short_conv", "shift"),
             ("model.layers.1.self_attn", "Lfm2Attention", "softmax_attention", "none"),
             ("model.layers.2.conv", "Lfm2ShortConv", "short_conv", "shift")],
    "kimi_linear": [("model.layers.0.self_attn", "KimiLinearDeltaAttention", "kimi_kda", "product"),
                    ("model.layers.1.self_attn", "KimiLinearAttention", "softmax_attention", "none"),
                    ("model.layers.2.self_attn", "KimiLinearDeltaAttention", "kimi_kda", "product")],
    "kimi_linear_kept": [("model.layers.0.self_attn", "KimiLinearDeltaAttention", "kimi_kda", "product"),
                         ("model.layers.1.self_attn", "KimiLinearAttention", None, None),
                         ("model.layers.2.self_attn", "KimiLinearDeltaAttention", "kimi_kda", "product")],
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_the_report_lists_every_layer_with_values_computed_directly(case, monkeypatch):
    conv = _converted(case, monkeypatch)
    vocab = int(conv.config.vocab_size)
    T = 18
    ids = torch.randint(2, vocab, (T,), generator=torch.Generator().manual_seed(2))
    rows = layer_report(conv, ids)
    assert [tuple(r) for r in rows] == [REPORT_COLUMNS] * len(rows)
    assert [(r["path"], r["family"]) for r in rows] == [(p, f) for p, f, _, _ in EXPECTED[case]]
    assert [r["index"] for r in rows] == list(range(len(rows)))
    mixers = seqmix_mixers(conv)
    xs = layer_inputs(conv, ids)
    for r, (path, _, name, kind) in zip(rows, EXPECTED[case]):
        if name is None:  # kept as transformers' own (Kimi-Linear's MLA)
            assert r["mixer"] == "kept: transformers' own" and path in conv.seqmix_kept
            assert r["state"] is None and r["lag"] is None and r["decay"] is None
            continue
        m = mixers[path]
        x = xs[path + ".mixer"]
        assert r["mixer"] == name == m.registry_name
        assert r["state"] == m.state_size(T)
        assert r["per_token"] == m.state_size(T + 1) - m.state_size(T)
        assert r["lambda"] == lambda_structure(m) and r["lambda"].startswith(kind)
        if name == "softmax_attention":
            c = m.config
            kv = c.kv_heads or c.heads
            per_token = c.kv_lora_rank + c.qk_rope_head_dim if c.kv_lora_rank else 2 * kv * (c.head_dim or c.d_model // c.heads)
            assert r["per_token"] == per_token  # keys and values per token (MLA: its latent and rotary key)
            assert r["decay"] is None
        else:
            assert r["per_token"] == 0
            lam = m.decays(x).detach()
            lam = lam.abs() if lam.is_complex() else lam
            assert r["decay"] == pytest.approx((float(lam.min()), float(lam.max())), rel=1e-5, abs=1e-30)
        phi = m.phi(x)[0].detach().float()
        assert r["lag"] == pytest.approx(float(mass_lag(phi).mean()), rel=1e-5)
        assert 1.0 <= r["lag"] <= T
    md = report_markdown(rows, title=case)
    page = report_html(rows, title=case)
    for path, *_ in EXPECTED[case]:
        assert path in md and path in page


def test_norm_and_gate_read_from_the_config():
    rows = {r["path"]: r for r in layer_report(_converted("qwen3_next"), torch.arange(2, 14))}
    attn, gdn = rows["model.layers.1.self_attn"], rows["model.layers.0.linear_attn"]
    assert "qk-norm" in attn["norm"] and "output gate" in attn["gate"]
    assert "RMSNorm" in gdn["norm"] and "silu" in gdn["gate"]
    rows = layer_report(_converted("mamba"), torch.arange(2, 14))
    assert rows[0]["norm"] == "none" and "SiLU(z)" in rows[0]["gate"]


def test_cli_report_writes_markdown_and_html(tmp_path, capsys):
    folder = tmp_path / "kimi"
    FRONT.tiny("kimi_linear").save_pretrained(folder)
    out = tmp_path / "out"
    assert main(["show", "--hf", str(folder), "--ids", ",".join(str(i) for i in range(2, 22)), "--report", "--out", str(out)]) == 0
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    for text in (md, page):
        assert "KimiLinearDeltaAttention" in text and "kimi_kda" in text
        assert "KimiLinearAttention" in text and "softmax_attention" in text
        assert "90% mass lag" in text
    assert md.count("\n| ") == 1 + 3  # heading row and one row per layer
    assert "wrote" in capsys.readouterr().out


def test_report_without_hf_is_refused(capsys):
    assert main(["show", "s6", "--report"]) != 0
    assert "--report" in capsys.readouterr().err


def test_lm_commands_refuse_an_init_from_hf_run_in_one_line(tmp_path, capsys):
    """lm eval / generate / export rebuild a seqmix LanguageModel; a run trained from a
    transformers checkpoint (--init-from-hf) is refused by analysis.trained.load_run, naming the run."""
    folder = tmp_path / "mamba"
    SHOW.tiny("mamba", vocab=256).save_pretrained(folder)
    out = tmp_path / "train"
    argv = SHOW._train_argv(folder, out, steps=2)
    argv[argv.index("--eval-every") + 1] = "2"
    assert main(argv) == 0
    (run,) = (out / "runs").iterdir()
    capsys.readouterr()
    for cmd in (["lm", "eval", run.name, "--runs", str(out / "runs")],
                ["lm", "generate", run.name, "--runs", str(out / "runs"), "--max-new-tokens", "2"],
                ["lm", "export", run.name, "--runs", str(out / "runs"), "--hf", str(tmp_path / "export")]):
        assert main(cmd) == 2, cmd
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and run.name in err[0] and "--init-from-hf" in err[0] and "do not support" in err[0], (cmd, err)
    assert not (tmp_path / "export").exists()
