"""The pictures of the README and of the docs' mixer gallery, drawn by seqmix itself.

    python docs/figures.py            # both
    python docs/figures.py front      # docs/img/front.png: the README's picture
    python docs/figures.py gallery    # docs/gallery/NAME.png for every registered mixer, and docs/gallery.md

Both go through the machinery of ``seqmix show`` (seqmix.analysis.show): the same embedded input
for every mixer, ``inspect_mixers`` for the maps Φ and the decay spectra, and
``overview_figure`` for the compact picture: each mixer's first map on top, as |Φ| on a logarithmic
colour scale (how far back each token reaches: a recurrence's decay spans decades), its decay
spectrum |Λ_i| below.

front: six mixers at their registry defaults (d_model 64) beside the first layer of two
architectures converted from transformers (``seqmix.interop.from_transformers``): Mamba and
Llama built from small configs with transformers' random initialization (nothing is downloaded;
the maps are those of untrained weights), drawn with ``seqmix.analysis.model_maps`` (the mean map
over the layer's heads or channels). gallery: every registered mixer at its registry example
config (``mixer_entry(name).example_config()``, the config the contract suite checks), one PNG
each, and the page that shows them by family.

The PNGs are committed (reduced to a 256-colour palette: a few kB each), since drawing all of them
takes minutes on 2 CPU cores; run this script again after adding or changing a mixer (a test
checks that the gallery lists every registered mixer). Random seed 0 throughout: a second run
draws the same pictures.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
from pathlib import Path

import torch

import seqmix
from seqmix.analysis import show

DOCS = Path(__file__).resolve().parent
#: the README's picture, its mixers (registry defaults at FRONT_D), its tokens and resolution
FRONT = DOCS / "img" / "front.png"
FRONT_MIXERS = ("softmax_attention", "linear_attention", "s6", "gla", "gated_deltanet", "hyena")
FRONT_D, FRONT_T, FRONT_DPI = 64, 64, 110
#: the gallery: one PNG per mixer at its example config, on GALLERY_T random tokens
GALLERY_DIR, GALLERY_PAGE = DOCS / "gallery", DOCS / "gallery.md"
GALLERY_T, GALLERY_DPI = 32, 90
SEED = 0


def png(fig) -> bytes:
    """The figure as a PNG with a 256-colour palette (Pillow, which matplotlib needs anyway)."""
    from PIL import Image

    img = Image.open(io.BytesIO(show.figure_png(fig))).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def converted_views(inp: show.ShowInput) -> list[show.MixerView]:
    """Layer 0 of a random-init Mamba and Llama (small configs), converted to seqmix mixers, read on ``inp``."""
    from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM

    from seqmix.analysis.model_maps import model_maps
    from seqmix.interop import from_transformers

    vocab = int(inp.tokens.max()) + 1
    configs = {
        "Mamba": (MambaForCausalLM, MambaConfig(vocab_size=vocab, hidden_size=FRONT_D, num_hidden_layers=2, state_size=16)),
        "Llama": (LlamaForCausalLM, LlamaConfig(vocab_size=vocab, hidden_size=FRONT_D, intermediate_size=2 * FRONT_D,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4)),
    }
    views = []
    for label, (cls, config) in configs.items():
        torch.manual_seed(SEED)
        model = from_transformers(cls(config).eval())
        with torch.no_grad():
            mm = model_maps(model, inp.tokens, layers=[0], n_heads=0, label=label,
                            source="transformers, random init")
        views += mm.views
    return views


def magnitude(views: list[show.MixerView]) -> list[show.MixerView]:
    """The views with |Φ| for Φ: on a logarithmic scale, how far back each token reaches, whatever the sign."""
    return [dataclasses.replace(v, phi=v.phi.abs(), map_labels=[f"|Φ|, {v.map_labels[0] if v.map_labels else v.map_unit + ' 0'}"])
            for v in views]


def front() -> Path:
    inp = show.make_input("random", FRONT_T, vocab=256, seed=SEED)
    mixers, _ = show.mixers_for_show(FRONT_MIXERS, seed=SEED, d_model=FRONT_D)
    views = show.inspect_mixers(mixers, inp, seed=SEED)
    real = converted_views(inp)
    titles = [v.label for v in views] + [f"{v.label.split(' ')[0]} (HF)" for v in real]
    subtitles = [v.family for v in views] + [f"layer 0 → {v.name}" for v in real]
    FRONT.parent.mkdir(parents=True, exist_ok=True)
    FRONT.write_bytes(png(show.overview_figure(magnitude(views + real), dpi=FRONT_DPI, titles=titles, subtitles=subtitles, log=True)))
    return FRONT


def gallery() -> list[Path]:
    """One PNG per registered mixer at its example config, then the page (:func:`gallery_page`)."""
    inp = show.make_input("random", GALLERY_T, seed=SEED)
    GALLERY_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    for e in seqmix.list_mixers():
        mixer = show.build_for_show(e.name, seed=SEED, **e.example_config())
        view = show.inspect_mixers([mixer], inp, seed=SEED)[0]
        path = GALLERY_DIR / f"{e.name}.png"
        path.write_bytes(png(show.overview_figure(magnitude([view]), dpi=GALLERY_DPI, log=True)))
        written.append(path)
        print(f"wrote {path.relative_to(DOCS.parent)}", flush=True)
    GALLERY_PAGE.write_text(gallery_page(), encoding="utf-8")
    return written + [GALLERY_PAGE]


def gallery_page() -> str:
    """docs/gallery.md: every registered mixer's picture, grouped by family, with its modes, state size and description."""
    entries = seqmix.list_mixers()
    families = sorted({e.family for e in entries})
    lines = [
        "# Mixer gallery",
        "",
        "<!-- written by docs/figures.py gallery: do not edit by hand -->",
        "",
        f"Every registered mixer ({len(entries)}) at its example config (the config the contract suite checks, "
        "`seqmix.mixer_entry(name).example_config()`), randomly initialized with seed 0, on the same "
        f"{GALLERY_T} random tokens: its first map (head or channel 0) on top, as |Φ| on a logarithmic colour scale, the magnitudes of its "
        "transition Λ_i below (one row per state, ordered by memory; the eigenvalues where Λ_i is not "
        "diagonal). `seqmix show NAME` draws the full view of any of them: every head, the decay spectrum "
        "and the DSF facts (docs: [seqmix show](show.md)). Drawn by `python docs/figures.py gallery`.",
        "",
    ]
    for fam in families:
        lines += [f"## {fam}", "", '<div class="grid cards" markdown>', ""]
        for e in (e for e in entries if e.family == fam):
            lines += [f"-   **`{e.name}`** · {', '.join(e.modes)}", "",
                      f"    ![{e.name}: map and decay spectrum](gallery/{e.name}.png)", "",
                      f"    {e.description.rstrip('. ')}. State: `{e.state_formula}`.", ""]
        lines += ["</div>", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["front", "gallery", "all"], default="all")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.what in ("front", "all"):
        print(f"wrote {front().relative_to(DOCS.parent)}", flush=True)
    if args.what in ("gallery", "all"):
        gallery()
    return 0


if __name__ == "__main__":
    sys.exit(main())
