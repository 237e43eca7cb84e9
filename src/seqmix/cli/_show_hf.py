"""`seqmix show --hf PATH_OR_HUB_ID ...`: the maps of real (transformers) models on one text
(docs/interop.md). Part of the ``show`` command of :mod:`.mixers`; it loads and converts with
:mod:`seqmix.interop` (offline) and draws with :mod:`seqmix.analysis.model_maps` and the show
mechanism (:mod:`seqmix.analysis.show`)."""

from __future__ import annotations

from ._common import print_facts_table


def parse_index_list(spec: str | None, argument: str, *, allow_all: bool = False):
    """"0,-1" -> [0, -1]; "all" -> "all" (when allowed); None -> None."""
    if spec is None:
        return None
    if allow_all and spec.strip() == "all":
        return "all"
    try:
        return [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"argument '{argument}': expected comma-separated indices{' or all' if allow_all else ''}, "
                         f"got {spec!r}") from None


def run_show_hf(args, text: str | None) -> int:
    from pathlib import Path

    import torch

    from seqmix.analysis import show
    from seqmix.analysis.model_maps import layers_figure, model_maps
    from seqmix.interop.load import load_config, load_converted, tokenize

    if args.mixers or args.run:
        raise ValueError("argument '--hf': real models are shown on their own; show MIXER names or --run in a separate call")
    if text is None and args.ids is None:
        raise ValueError("argument '--text': --hf needs the text the models read (--text, --text-file or --ids)")
    for name, value, low in (("maps", args.maps, 1), ("dpi", args.dpi, 10), ("band", args.band, 1)):
        if value < low:
            raise ValueError(f"argument '--{name}' must be >= {low}, got {value}")
    layers = parse_index_list(args.layers, "--layers", allow_all=True)
    heads = parse_index_list(args.heads, "--heads")
    from seqmix._checks import PICTURE_SUFFIXES, output_dir, picture_paths

    if not args.max_memory > 0:
        raise ValueError(f"argument '--max-memory' must be > 0 GiB, got {args.max_memory}")
    for src in args.hf:  # every source checked (offline, family) before any weight is loaded
        load_config(src)
    labels = _labels(args.hf)
    if getattr(args, "report", False):
        if Path(args.out).suffix.lower() in PICTURE_SUFFIXES:
            raise ValueError(f"argument --out: --report writes a page per model (report.md, report.html): expected a folder, "
                             f"got {args.out!r}")
        return _run_report(args, text, labels, output_dir(args.out, "--out"))  # a file in the way: one line before the work
    pictures, suffix = (["report"], ".html") if args.html else (["maps", "layers"], ".png")
    paths = picture_paths(args.out, pictures, "--out", suffix)  # a file or folder in the way: one line before minutes of work
    models, descs = [], []
    for src, label in zip(args.hf, labels):
        model, what = load_converted(src)
        toks, how = tokenize(src, text, ids=args.ids, vocab_size=int(model.config.vocab_size), seq_len=args.seq_len)
        with torch.no_grad():
            mm = model_maps(model, toks, layers=layers, heads=heads, n_heads=max(0, args.maps - 1), band=args.band,
                            label=label, source=what, max_bytes=int(args.max_memory * 2**30))
        models.append(mm)
        descs.append(f"{label}: {how}")
        del model
    views = [v for mm in models for v in mm.views]
    snippet = (text[:60] + ("…" if len(text) > 60 else "")) if text is not None else f"ids {args.ids[:40]}"
    desc = f"text {snippet!r}; " + "; ".join(descs)
    written = []
    across = layers_figure(models, dpi=args.dpi)
    if args.html:
        written.append(show.write_html(paths["report"], views, theory={"decay memory and state size across layers": across},
                                       input_description=desc, log=args.log, max_maps=args.maps, dpi=args.dpi,
                                       title="seqmix show --hf " + " ".join(labels), theory_heading="Across layers",
                                       reference="a randomly initialized softmax attention on the same layer input"))
    else:
        paths["maps"].write_bytes(show.figure_png(show.show_figure(views, log=args.log, max_maps=args.maps, dpi=args.dpi)))
        paths["layers"].write_bytes(show.figure_png(across))
        written += [paths["maps"], paths["layers"]]
    print_facts_table(views, f"seqmix show --hf: {desc}; numbers of the mean map Φ̄")
    for mm in models:
        print(f"{mm.label}: state floats per sequence (T = {mm.T}) over {len(mm.layers)} layers = "
              f"{sum(s.state_size for s in mm.layers):,}; median memory per layer: "
              + " ".join(f"{s.memory:.3g}" for s in mm.layers))
    for p in written:
        print(f"wrote {p}")
    return 0


def _run_report(args, text: str | None, labels: list[str], out) -> int:
    """``--report``: one page per model (Markdown and HTML) listing every layer (analysis.model_maps.layer_report)."""
    import re

    import torch

    from seqmix.analysis.model_maps import REPORT_NOTE, layer_report, report_html, report_markdown
    from seqmix.interop.load import load_converted, tokenize

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for src, label in zip(args.hf, labels):
        model, what = load_converted(src)
        toks, how = tokenize(src, text, ids=args.ids, vocab_size=int(model.config.vocab_size), seq_len=args.seq_len)
        with torch.no_grad():
            rows = layer_report(model, toks, max_bytes=int(args.max_memory * 2**30))
        del model
        title = f"seqmix show --hf {label} --report"
        note = f"{what}; {how}; T = {int(toks.numel())} tokens. {REPORT_NOTE}"
        md = report_markdown(rows, title=title, note=note)
        stem = "report" if len(labels) == 1 else "report_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
        (out / f"{stem}.md").write_text(md, encoding="utf-8")
        (out / f"{stem}.html").write_text(report_html(rows, title=title, note=note), encoding="utf-8")
        written += [out / f"{stem}.md", out / f"{stem}.html"]
        print(md)
    for p in written:
        print(f"wrote {p}")
    return 0


def _labels(sources) -> list[str]:
    """Short, distinct labels: the folder or repo name (with #2, #3 for repeats)."""
    from pathlib import Path

    seen: dict[str, int] = {}
    out = []
    for s in sources:
        name = Path(str(s).rstrip("/")).name or str(s)
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out
