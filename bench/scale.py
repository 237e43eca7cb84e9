"""Mixed precision and data parallelism on this CPU (docs/scale.md).

1. Every registered mixer at its default config (d_model 64, batch 2, T = 512): forward +
   backward time in float32 and under autocast bf16, their ratio, and the relative error
   max|y_bf16 - y_fp32| / max|y_fp32| of the output (target: <= 3e-2 at T = 512), also
   with bf16 parameters (mixer.to(bfloat16) against float32 on the same rounded weights).
2. DDP over 2 gloo processes (1 thread each) against 1 process (1 thread, and 2 threads:
   the same cores), the same global batch, a small LanguageModel, the trainer's machinery (seqmix.train.distributed.Parallel):
   tokens/s of each and their ratio, and the all-reduce share of the DDP step time, measured
   two ways: (a) 1 - t(step under no_sync) / t(step), (b) a bare all_reduce of the gradient's
   bytes / t(step).

    python bench/scale.py            # T = 512, every mixer (minutes on 2 cores)
    python bench/scale.py --quick    # T = 128, a few mixers
"""

from __future__ import annotations

import os
import socket
import time

import torch

from _common import base_parser, print_table, setup, target_line, timeit, write_json

import seqmix  # noqa: E402  (after _common put src/ on the path)

BF16_TARGET = 3e-2


def rel(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def matmul_dtypes(repeats, device, n=512):
    """ms of one n×n×n matmul per dtype: whether the device has fast bf16 / fp16 matmuls (the
    trainer refuses fp16 on the CPU: emulated here)."""
    a = torch.randn(n, n, device=device)
    out = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        x = a.to(dt)
        out[name] = timeit(lambda: x @ x, repeats=repeats, device=device)["min_ms"]
    return out


def mixer_rows(names, T, repeats, device):
    rows, data = [], {}
    for name in names:
        torch.manual_seed(0)
        m = seqmix.build_mixer(name, d_model=64).to(device)
        x = torch.randn(2, T, 64, device=device)

        def step(dtype=None):
            xx = x.clone().requires_grad_(True)
            if dtype is None:
                y = m(xx)
            else:
                with torch.autocast(device, dtype=dtype):
                    y = m(xx)
            y.float().mean().backward()
            return y

        with torch.no_grad():
            y32 = m(x)
            with torch.autocast(device, dtype=torch.bfloat16):
                y16 = m(x)
            mb = seqmix.build_mixer(name, d_model=64).to(device)
            mb.load_state_dict(m.state_dict())
            mb = mb.to(torch.bfloat16)
            ref = seqmix.build_mixer(name, d_model=64).to(device).to(torch.bfloat16).float()
            ref.load_state_dict(mb.state_dict())
            err_p = rel(mb(x.bfloat16()), ref(x.bfloat16().float()))
        err = rel(y16, y32)
        # fp32 and bf16 alternate, so that the machine's load hits both alike; the min is reported
        t32 = t16 = float("inf")
        step(), step(torch.bfloat16)
        for _ in range(repeats):
            t32 = min(t32, timeit(lambda: step(), repeats=1, warmup=0, device=device)["min_ms"])
            t16 = min(t16, timeit(lambda: step(torch.bfloat16), repeats=1, warmup=0, device=device)["min_ms"])
        tok = 2 * T
        rows.append([name, t32, t16, t32 / t16, tok / t32 * 1e3, tok / t16 * 1e3, err, err_p,
                     "met" if max(err, err_p) <= BF16_TARGET else "NOT MET"])
        data[name] = dict(fp32_ms=t32, bf16_ms=t16, speedup=t32 / t16, rel_err_bf16_autocast=err, rel_err_bf16_params=err_p)
        print(f"  {name}: fp32 {t32:.1f} ms, bf16 {t16:.1f} ms, rel. error {err:.4f} / {err_p:.4f}", flush=True)
    return rows, data


# -- DDP ----------------------------------------------------------------------------------------


def _model_config(quick):
    from seqmix.models import ModelConfig

    return ModelConfig(mixer="gla", d_model=64 if quick else 128, n_layers=2, vocab_size=256, max_seq_len=256)


def _ddp_rank(rank, world, threads, port, quick, steps, batch, T, queue):
    """One process of the DDP measurement (world 1: the single-process baseline)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    from seqmix.models import LanguageModel
    from seqmix.train.distributed import Parallel

    par = Parallel("ddp" if world > 1 else "none", "cpu", timeout=300)
    torch.manual_seed(0)
    model = LanguageModel(_model_config(quick))
    wrapped = par.wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 256, (batch, T), generator=g)
    labels = torch.randint(0, 256, (batch, T), generator=g)

    def step(sync=True):
        x, y, w = par.shard(inputs, labels)
        ctx = wrapped.no_sync() if (not sync and world > 1) else _null()
        with ctx:
            logits, target = par.forward(model, x, y)
            loss = torch.nn.functional.cross_entropy(logits, target) * w
            opt.zero_grad(set_to_none=True)
            loss.backward()
        opt.step()

    def timed(fn, n):
        fn()
        par.barrier()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    out = {"step_s": timed(step, steps)}
    if world > 1:
        import torch.distributed as dist

        out["nosync_step_s"] = timed(lambda: step(sync=False), steps)
        flat = torch.zeros(sum(p.numel() for p in model.parameters()))
        out["allreduce_s"] = timed(lambda: dist.all_reduce(flat), steps)
        out["grad_mb"] = flat.numel() * 4 / 2**20
    if par.is_main:
        queue.put(out)
    par.close()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_rows(quick, steps):
    import torch.multiprocessing as mp

    batch, T = (8, 128) if quick else (16, 256)
    ctx = mp.get_context("spawn")
    res = {}
    for key, world, threads in (("1x1", 1, 1), ("1x2", 1, 2), ("2x1", 2, 1)):
        q = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_ddp_rank, args=(r, world, threads, port, quick, steps, batch, T, q)) for r in range(world)]
        for p in procs:
            p.start()
        res[key] = q.get(timeout=1200)
        for p in procs:
            p.join()
    tokens = batch * T
    one, one2, two = res["1x1"], res["1x2"], res["2x1"]
    tps1, tps12, tps2 = tokens / one["step_s"], tokens / one2["step_s"], tokens / two["step_s"]
    share_nosync = max(0.0, 1 - two["nosync_step_s"] / two["step_s"])
    share_bare = two["allreduce_s"] / two["step_s"]
    rows = [
        ["1 process x 1 thread", batch, one["step_s"] * 1e3, tps1, 1.0, "", ""],
        ["1 process x 2 threads", batch, one2["step_s"] * 1e3, tps12, tps12 / tps1, "", ""],
        ["DDP 2 gloo ranks x 1 thread", batch, two["step_s"] * 1e3, tps2, tps2 / tps1, share_nosync, share_bare],
    ]
    data = dict(global_batch=batch, T=T, model=_model_config(quick).model_dump(mode="json"), single_1thread=one,
                single_2threads=one2, ddp=two, tokens_per_s_single_1thread=tps1, tokens_per_s_single_2threads=tps12,
                tokens_per_s_ddp=tps2, ratio_vs_1thread=tps2 / tps1, ratio_vs_2threads=tps2 / tps12,
                allreduce_share_nosync=share_nosync, allreduce_share_bare=share_bare)
    return rows, data


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--mixers", default=None, help="comma-separated mixers (default: every registered one)")
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--no-mixers", action="store_true")
    args = p.parse_args()
    info = setup(args)
    device = "cpu" if args.device != "cuda" else "cuda"
    T = 128 if args.quick else 512
    names = args.mixers.split(",") if args.mixers else (
        ["linear_attention", "retnet", "hyena", "mamba"] if args.quick else [e.name for e in seqmix.list_mixers()])
    mm = matmul_dtypes(args.repeats, device)
    print(f"512x512x512 matmul, {torch.get_num_threads()} threads: " + ", ".join(f"{k} {v:.2f} ms" for k, v in mm.items()))
    payload = {"machine": info, "T": T, "matmul_ms": mm}
    if args.no_mixers:
        names = []
    print(f"mixers at d_model 64, batch 2, T = {T}, forward + backward, {device}, {torch.get_num_threads()} threads")
    rows, data = mixer_rows(names, T, args.repeats, device)
    print_table(f"bf16 autocast vs fp32 (T = {T})",
                ["case", "fp32 ms", "bf16 ms", "fp32/bf16", "fp32 tok/s", "bf16 tok/s", "rel.err autocast", "rel.err bf16 params", "target"],
                rows)
    worst = max((max(d["rel_err_bf16_autocast"], d["rel_err_bf16_params"]) for d in data.values()), default=float("nan"))
    targets = [target_line(f"bf16 relative error <= {BF16_TARGET} at T = {T}", worst <= BF16_TARGET if T == 512 and data else None,
                           f"worst {worst:.4f} over {len(data)} mixers" + ("" if T == 512 else " (T = 512 only without --quick)"))]
    payload.update(mixers=data, targets=targets)
    if not args.no_ddp:
        print("\nDDP: 2 gloo processes vs 1 process, same global batch ...", flush=True)
        drows, ddata = ddp_rows(args.quick, max(args.repeats, 5))
        print_table("DDP on CPU (gloo), same global batch",
                    ["case", "global batch", "step ms", "tokens/s", "vs 1x1", "all-reduce share (no_sync)", "all-reduce share (bare)"],
                    drows)
        payload["ddp"] = ddata
    write_json(args, "scale", payload)


if __name__ == "__main__":
    main()
