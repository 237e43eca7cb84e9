"""LRA data (seqmix.data.lra): generators against the original semantics, loaders on small
fixtures written here in the released formats. Nothing is downloaded."""

from __future__ import annotations

import pickle
import statistics

import numpy as np
import pytest
import torch

from seqmix.data import DataConfig, build_data
from seqmix.data.lra import (
    LISTOPS_SYMBOLS, LRAImageConfig, ListOpsConfig, PathfinderConfig, RetrievalConfig, LRATextConfig, _listops_batch, grayscale,
    listops_detokenize, listops_generate, listops_tokenize, listops_tree, pathfinder_generate, read_listops_tsv,
    read_pathfinder, write_listops_tsv, write_pathfinder,
)

# ------------------------------------------------------------------------------------------
# an independent ListOps evaluator: recursive descent over the source string
# ------------------------------------------------------------------------------------------


def evaluate(source: str) -> tuple[int, int, int]:
    """(value, depth, max arguments) of a ListOps source, parentheses or not."""
    words = source.replace("(", " ").replace(")", " ").split()
    pos = 0

    def node(depth):
        nonlocal pos
        w = words[pos]
        pos += 1
        if w.isdigit():
            return int(w), depth, 0
        args, deep, widest = [], depth, 0
        while words[pos] != "]":
            v, d, a = node(depth + 1)
            args.append(v)
            deep, widest = max(deep, d), max(widest, a)
        pos += 1
        value = {"[MIN": min, "[MAX": max, "[SM": lambda xs: sum(xs) % 10,
                 "[MED": lambda xs: int(statistics.median(xs))}[w](args)
        return value, deep, max(widest, len(args))

    out = node(1)
    assert pos == len(words), "trailing tokens"
    return out


def test_evaluator_on_a_released_style_line():
    src = "( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )"
    assert evaluate(src)[0] == 9
    assert evaluate("[MED 1 2 3 8 ]")[0] == 2  # int(2.5)
    assert evaluate("[SM 9 8 [MIN 4 7 ] ]")[0] == 1


def test_listops_labels_equal_the_evaluated_expression():
    rng = np.random.default_rng(0)
    a = listops_generate(rng, 200, min_length=30, max_length=300, max_depth=6, max_args=5, seq_len=300)
    lengths = (a.inputs > 0).sum(1)
    assert ((lengths > 30) & (lengths < 300)).all()
    assert len({r.tobytes() for r in a.inputs}) == 200  # distinct
    ops = set()
    for x, y in zip(a.inputs, a.labels):
        src = listops_detokenize(x)
        value, depth, widest = evaluate(src)
        assert value == y
        assert depth <= 6 and 2 <= widest <= 5
        ops |= {w for w in src.split() if w.startswith("[")}
    assert ops == {"[MIN", "[MAX", "[MED", "[SM"}


def test_listops_paper_scale_lengths_and_labels():
    a = listops_generate(np.random.default_rng(1), 20)  # 500 < length < 2000, depth 10, 10 args
    lengths = (a.inputs > 0).sum(1)
    assert a.inputs.shape == (20, 2000) and ((lengths > 500) & (lengths < 2000)).all()
    for x, y in zip(a.inputs, a.labels):
        v, depth, widest = evaluate(listops_detokenize(x))
        assert v == y and depth <= 10 and widest <= 10


def test_vectorised_generator_matches_the_recursive_reference_in_distribution():
    """P(length = 1) = 0.75, P(length = 4) (an operator over two digits) and the mean length,
    at depth 3 where trees are small: the lockstep walk and the recursion agree."""
    n = 6000
    rng = np.random.default_rng(2)
    ref = np.array([listops_tree(rng, max_depth=3, max_args=4)[1] for _ in range(n)])
    _, vec, _ = _listops_batch(np.random.default_rng(3), n, max_depth=3, max_args=4, max_length=10_000)
    for L in (1, 4, 5):
        assert abs((ref == L).mean() - (vec == L).mean()) < 0.025, L
    assert abs(ref.mean() - vec.mean()) < 0.1 * ref.mean()


def test_listops_tsv_round_trip_and_released_format(tmp_path):
    a = listops_generate(np.random.default_rng(4), 30, min_length=10, max_length=80, seq_len=80)
    f = tmp_path / "basic_test.tsv"
    write_listops_tsv(f, a)
    lines = f.read_text().splitlines()
    assert lines[0] == "Source\tTarget" and lines[1].startswith("(")
    b = read_listops_tsv(f, seq_len=80)
    assert np.array_equal(a.inputs, b.inputs) and np.array_equal(a.labels, b.labels)
    # parenthesised form = LRA's to_string: k + 1 opening parentheses for k arguments
    ids = listops_tokenize("[MAX 2 9 [MIN 4 7 ] 0 ]")
    assert listops_detokenize(ids, parens=True) == "( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )"
    # a hand-written file in the released layout loads through the task config
    g = tmp_path / "released.tsv"
    g.write_text("Source\tTarget\n( ( ( [SM 3 ) 9 ) ] )\t2\n( ( ( ( [MED 1 ) 5 ) 7 ) ] )\t5\n")
    seg = build_data(DataConfig(train=[ListOpsConfig(path=str(g), seq_len=16)], test=[ListOpsConfig(path=str(g), seq_len=16)]),
                     use_cache=False)[0].segments[0]
    assert seg.labels.tolist() == [2, 5]
    assert listops_detokenize(seg.inputs[1].numpy()) == "[MED 1 5 7 ]"


def test_listops_errors(tmp_path):
    with pytest.raises(ValueError, match="basic_train.tsv"):
        read_listops_tsv(tmp_path / "nope.tsv")
    (tmp_path / "bad.tsv").write_text("Source\tTarget\n[FOO 1 ]\t1\n")
    with pytest.raises(ValueError, match="unknown symbol"):
        read_listops_tsv(tmp_path / "bad.tsv")
    with pytest.raises(ValueError, match="num_examples"):
        ListOpsConfig()
    assert len(LISTOPS_SYMBOLS) == 15
    wide = listops_generate(np.random.default_rng(0), 3, min_length=5, max_length=20, seq_len=32)  # padded past max_length
    assert wide.inputs.shape == (3, 32) and (wide.inputs[:, 19:] == 0).all()


# ------------------------------------------------------------------------------------------
# Pathfinder
# ------------------------------------------------------------------------------------------


def _touch(a: np.ndarray, b: np.ndarray, R: int) -> bool:
    """Do two pixel masks [R*R] share a pixel or an 8-neighbour?"""
    a, b = a.reshape(R, R), b.reshape(R, R)
    ys, xs = np.nonzero(a)
    for y, x in zip(ys, xs):
        if b[max(0, y - 1):y + 2, max(0, x - 1):x + 2].any():
            return True
    return False


@pytest.mark.parametrize("difficulty,R", [("hard", 32), ("easy", 64)])
def test_pathfinder_semantics(difficulty, R):
    cfg = PathfinderConfig(num_examples=40, difficulty=difficulty, resolution=R)
    arr, parts = pathfinder_generate(np.random.default_rng(5), 40, resolution=R, contour_length=14 if difficulty == "hard" else 6,
                                     return_parts=True)
    assert cfg.seq_len == R * R and arr.inputs.shape == (40, R * R)
    assert set(np.unique(arr.inputs)) <= {1, 256}
    assert 0 < arr.labels.mean() < 1
    curve, markers = parts["curve"], parts["markers"]
    for x, y, c, mk in zip(arr.inputs, arr.labels, curve, markers):
        assert ((c > 0) <= (x > 1)).all()  # every curve pixel is drawn
        assert not _touch(c == 1, c == 2, R)  # the two curves never touch
        ends = []
        for (r, col) in mk:
            assert x[r * R + col] == 256  # a marker is drawn there
            ids = {int(c[r * R + col])} - {0}
            ends.append(ids)
        # marker 1 is on curve 1; marker 2 on curve 1 iff connected, else on curve 2
        assert ends[0] == {1}
        assert ends[1] == ({1} if y == 1 else {2})
        # markers sit at curve ends: the far end of the same curve carries no marker when y = 0
        assert tuple(mk[0]) != tuple(mk[1])


def test_pathfinder16_semantics():
    """R = 16 (the tiny scale's length 256) at 32 × 32's pixel sizes and 4 dashes: a 3 × 3
    marker on each of the two path ends, curves that never touch, balanced labels; with
    clear_markers no marker touches the other curve."""
    R, n, length = 16, 200, 4
    cfg = PathfinderConfig(num_examples=n, resolution=16, pixel_scale=1, contour_length=length, clear_markers=True)
    assert cfg.seq_len == 256 and cfg.slice_name == "pathfinder16-4dash"
    arr, parts = pathfinder_generate(np.random.default_rng(7), n, resolution=R, contour_length=length, pixel_scale=1,
                                     clear_markers=True, return_parts=True)
    again = cfg.generate(np.random.default_rng(7))
    assert np.array_equal(again.inputs, arr.inputs) and np.array_equal(again.labels, arr.labels)
    assert arr.inputs.shape == (n, R * R) and set(np.unique(arr.inputs)) <= {1, 256}
    assert 0.4 < arr.labels.mean() < 0.6  # a fair coin over 200 images
    curve, markers = parts["curve"], parts["markers"]
    for x, y, c, mk in zip(arr.inputs, arr.labels, curve, markers):
        img, c = (x > 1).reshape(R, R), c.reshape(R, R)
        assert ((c > 0) <= img).all()
        assert not _touch(c == 1, c == 2, R)
        assert tuple(mk[0]) != tuple(mk[1])
        for k, (r, col) in enumerate(mk):
            assert img[max(0, r - 1):r + 2, max(0, col - 1):col + 2].all()  # a 3 × 3 marker, not one pixel
            own = 1 if k == 0 or y == 1 else 2
            assert c[r, col] == own  # marker 2 on curve 1 iff connected
            assert not (c[max(0, r - 2):r + 3, max(0, col - 2):col + 3] == 3 - own).any()  # clear of the other curve
            # an end of its curve: 3 turns of at most 30° keep the heading within 90°, so the
            # distance from one end grows along the curve: the marker is (up to the rounding
            # to pixels) the farthest pixel from the curve pixel farthest from it
            pix = np.argwhere(c == own)
            far = pix[np.argmax(((pix - [r, col]) ** 2).sum(1))]
            reach = np.sqrt(((pix - far) ** 2).sum(1))
            assert np.hypot(r - far[0], col - far[1]) >= reach.max() - 1.0
        if y == 1:  # both ends of curve 1 carry a marker
            assert np.hypot(*(mk[0] - mk[1])) >= (length - 1) * 2.5 * np.cos(np.pi / 4) - 1


def test_pathfinder_marker_intensity_marks_only_the_discs():
    """marker_intensity draws the two 3 × 3 marker discs in their own value over the same image:
    the curves, distractors and labels of the seed are unchanged, and without it the image is
    the LRA one (markers in the curves' value)."""
    kw = dict(resolution=16, contour_length=4, pixel_scale=1, clear_markers=True, return_parts=True)
    plain, parts = pathfinder_generate(np.random.default_rng(3), 100, **kw)
    marked, parts2 = pathfinder_generate(np.random.default_rng(3), 100, marker_intensity=128, **kw)
    assert np.array_equal(plain.labels, marked.labels) and np.array_equal(parts["markers"], parts2["markers"])
    assert np.array_equal(plain.inputs > 1, marked.inputs > 1)  # the same pixels are on
    assert set(np.unique(plain.inputs)) == {1, 256} and set(np.unique(marked.inputs)) == {1, 129, 256}
    for x, mk in zip(marked.inputs.reshape(-1, 16, 16), parts2["markers"]):
        disc = np.zeros((16, 16), bool)
        for r, c in mk:
            disc[max(0, r - 1):r + 2, max(0, c - 1):c + 2] = True
        assert np.array_equal(x == 129, disc)  # exactly the discs
    cfg = PathfinderConfig(num_examples=100, resolution=16, pixel_scale=1, contour_length=4, clear_markers=True,
                           marker_intensity=128)
    assert np.array_equal(cfg.generate(np.random.default_rng(3)).inputs, marked.inputs)
    with pytest.raises(ValueError, match="marker_intensity"):
        pathfinder_generate(np.random.default_rng(0), 4, resolution=16, contour_length=4, pixel_scale=1, marker_intensity=0)
    with pytest.raises(ValueError):
        PathfinderConfig(num_examples=4, resolution=16, pixel_scale=1, contour_length=4, marker_intensity=256)


def test_pathfinder16_needs_explicit_pixel_sizes():
    with pytest.raises(ValueError, match="pixel_scale"):
        PathfinderConfig(num_examples=10, resolution=16)
    with pytest.raises(ValueError, match="pixel_scale"):
        pathfinder_generate(np.random.default_rng(0), 4, resolution=16, contour_length=4)
    assert PathfinderConfig(num_examples=10).slice_name == "pathfinder32-hard"


def test_pathfinder_loader_reads_the_released_layout(tmp_path):
    arr = pathfinder_generate(np.random.default_rng(6), 20, contour_length=6)
    write_pathfinder(tmp_path / "pathfinder32", arr, "easy", per_folder=7)
    assert (tmp_path / "pathfinder32" / "curv_baseline" / "metadata" / "2.npy").is_file()
    train = read_pathfinder(tmp_path / "pathfinder32", "easy", split="train")
    test = read_pathfinder(tmp_path / "pathfinder32", "easy", split="test")
    assert len(train.labels) == 16 and len(test.labels) == 2
    assert np.array_equal(train.inputs, arr.inputs[:16]) and np.array_equal(test.labels, arr.labels[18:])
    seg = build_data(DataConfig(train=[PathfinderConfig(path=str(tmp_path / "pathfinder32"), difficulty="easy")],
                                test=[PathfinderConfig(path=str(tmp_path / "pathfinder32"), difficulty="easy", split="val")]),
                     use_cache=False)[1].segments[0]
    assert torch.equal(seg.inputs.long(), torch.from_numpy(arr.inputs[16:18]))
    with pytest.raises(ValueError, match="lra_release/pathfinder"):
        read_pathfinder(tmp_path / "missing", "hard")


# ------------------------------------------------------------------------------------------
# Text, Retrieval, Image
# ------------------------------------------------------------------------------------------


def test_text_from_acl_imdb_folder_and_hf_folder(tmp_path):
    root = tmp_path / "aclImdb"
    for sub, texts in (("neg", ["bad film", "awful"]), ("pos", ["great!", "lovely é"])):
        (root / "train" / sub).mkdir(parents=True)
        for i, t in enumerate(texts):
            (root / "train" / sub / f"{i}_1.txt").write_text(t, encoding="utf-8")
    a = LRATextConfig(path=str(root), seq_len=8).generate(np.random.default_rng(0))
    assert a.labels.tolist() == [0, 0, 1, 1]
    assert a.inputs[0, :8].tolist() == [b + 1 for b in b"bad film"]  # bytes + 1, truncated to 8
    assert a.inputs[3].tolist() == [b + 1 for b in "lovely é".encode()][:8]  # 9 bytes, truncated
    assert a.inputs[1].tolist() == [b + 1 for b in b"awful"] + [0, 0, 0]  # right padding with 0
    import datasets

    datasets.Dataset.from_dict({"text": ["ab", "c"], "label": [1, 0]}).save_to_disk(str(tmp_path / "hf"))
    b = LRATextConfig(hf_name=str(tmp_path / "hf"), seq_len=4).generate(np.random.default_rng(0))
    assert b.inputs.tolist() == [[98, 99, 0, 0], [100, 0, 0, 0]] and b.labels.tolist() == [1, 0]
    with pytest.raises(ValueError, match="aclImdb"):
        LRATextConfig(path=str(tmp_path / "none")).generate(np.random.default_rng(0))


def test_retrieval_from_released_tsv(tmp_path):
    rows = ["1\tid1\tid2\tdoc one\tdoc two", "0\tid3\tid4\tthird\tfourth paper"]
    (tmp_path / "new_aan_pairs.train.tsv").write_text("\n".join(rows) + "\n")
    cfg = RetrievalConfig(path=str(tmp_path), seq_len=6)
    seg = build_data(DataConfig(train=[cfg], test=[cfg], batch_size=2), use_cache=False)[0]
    b = next(seg.batches())
    assert b.inputs.shape == (2, 2, 6) and b.labels.tolist() == [1, 0]
    assert b.inputs[1, 1].tolist() == [b_ + 1 for b_ in b"fourth"]
    with pytest.raises(ValueError, match="new_aan_pairs"):
        RetrievalConfig(path=str(tmp_path), split="test").generate(np.random.default_rng(0))
    with pytest.raises(ValueError, match="exactly one"):
        RetrievalConfig()


def test_image_from_cifar_batches_and_hf(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    blob = {b"data": rgb.transpose(0, 3, 1, 2).reshape(3, -1), b"labels": [3, 1, 4]}
    for i in range(1, 6):
        with open(root / f"data_batch_{i}", "wb") as f:
            pickle.dump(blob, f)
    a = LRAImageConfig(path=str(root), num_examples=3).generate(rng)
    pil = np.stack([np.asarray(Image.fromarray(im).convert("L"), np.int64).reshape(-1) for im in rgb])
    assert np.array_equal(a.inputs - 1, pil)  # PIL's luma, an independent implementation
    assert a.labels.tolist() == [3, 1, 4]
    assert np.array_equal(grayscale(rgb).reshape(3, -1), pil)
    import datasets

    ds = datasets.Dataset.from_dict({"img": [Image.fromarray(im) for im in rgb], "label": [3, 1, 4]})
    ds.save_to_disk(str(tmp_path / "hf"))
    b = LRAImageConfig(hf_name=str(tmp_path / "hf")).generate(rng)
    assert np.array_equal(b.inputs, a.inputs)
    with pytest.raises(ValueError, match="cifar-10-batches-py"):
        LRAImageConfig(path=str(tmp_path / "missing")).generate(rng)
    with pytest.raises(ValueError, match="could not load the HuggingFace dataset"):
        LRAImageConfig(hf_name=str(tmp_path / "not-a-dataset-folder-xyz"), split="test").generate(rng)


class _Payload:
    """Unpickling this runs os.system (it would create the marker file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_cifar_batches_that_would_run_code_are_refused(tmp_path):
    """A CIFAR-10 folder from someone else is read with a restricted unpickler: a batch that
    names os.system is refused before anything runs (a plain pickle.load would run it)."""
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    marker = tmp_path / "ran"
    for i in range(1, 6):
        with open(root / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"data": _Payload(marker), b"labels": [0]}, f)
    with pytest.raises(ValueError, match=r"data_batch_1.*holds pickled Python objects \(posix.system\)"):
        LRAImageConfig(path=str(root), num_examples=1).generate(np.random.default_rng(0))
    assert not marker.exists()


def test_data_config_kinds():
    lo = ListOpsConfig(num_examples=4, min_length=5, max_length=20, seq_len=20)
    assert DataConfig(train=[lo], test=[lo]).num_classes == 10
    from seqmix.data import MQARConfig

    with pytest.raises(ValueError, match="all token-level tasks or all LRA"):
        DataConfig(train=[lo.model_copy(update={"vocab_size": 64})], test=[MQARConfig(vocab_size=64, seq_len=20, num_kv_pairs=2, num_examples=4)])
