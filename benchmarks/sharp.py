r"""The sharp-head suite: SBM attention heads whose memberships concentrate on
one of V clusters (0.98 on a token's own, the rest spread evenly over the
other k - 1) and whose block gives p = 0.8 inside a cluster and about 3e-4
across, so that each head's graph is V nearly complete blocks of about n / V
random tokens each (expected density about 0.8 / V). That is what the
heads that learned to separate their blocks look like (docs/performance.md,
"How sharp trained heads are"), and the case a tiled path would serve.

Timed through the public :func:`~sbm_pyg.nn.sbm_attention` (exact mode,
sampling and the straight-through backward into the memberships and the
block, fwd+bwd) against SDPA on the same queries, keys and values, in
turns: on the edge path (its sparse kernel named, ``sbm``) and as
:obj:`attention_backend="auto"` chooses (``auto``, the regime it took in
``auto_backends``); on the CPU the edge path's profiler parts: the
sampler, the attention's forward and its backward (the estimator's
membership gradients included). Beside them the tiled
path, the same law and estimator, fwd+bwd from the plan
(:func:`~sbm_pyg.sampling.tiles.plan_tiles`, 64 x 64 tiles) on: the tiles
drawn and attended by the dense-regime kernel
(:func:`~sbm_pyg.nn.tiled_sbm_attention`, ``tiles``; ``tiles_kernel`` says
which ran), and its PyTorch fallback, the draw
(:func:`~sbm_pyg.sampling.tiled_graph.draw_tiled`) and
:func:`~sbm_pyg.nn.tiled_attention` (``tiles_torch``).

:func:`bench_sharp_conv` times the layer: an :class:`~sbm_pyg.nn.SBMConv`
whose heads are such a head through its own projections, MLP and
clusters (:func:`sharp_conv`), fwd+bwd against
:class:`torch.nn.MultiheadAttention`."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from benchmarks.attention import batched, run_sdpa
from benchmarks.cases import CLUSTERS, HEAD_DIM, HEADS, backward, qkv
from benchmarks.layer import breakdown, format_breakdown
from benchmarks.measure import median_times
from sbm_pyg.nn import (
    SBMAttentionOptions,
    SBMConv,
    sbm_attention,
    tiled_attention,
    tiled_sbm_attention,
)
from sbm_pyg.ops.backend_info import dense_runs, resolve_backend
from sbm_pyg.sampling.tiled_graph import draw_tiled
from sbm_pyg.sampling.tiles import in_tiles, plan_tiles

#: A token's membership of its own cluster, and the edge probability inside
#: a cluster.
OWN, INSIDE = 0.98, 0.8
#: The tiled path's tiles and the least expected fill of a tiled cluster pair.
TILE, MIN_FILL = 64, 0.5
#: The attention's forward and backward operators (the sparse and the
#: dense-regime kernels'), timed with what runs inside them: the dense
#: kernel's products, the estimator's gradients.
FORWARD_OPS = ("GeneratedBackwardFor_sbm_pyg_sparse_attention_default",
               "GeneratedBackwardFor_sbm_pyg_dense_attention_default")
BACKWARD_OPS = ("sbm_pyg::sparse_attention_backward",
                "sbm_pyg::dense_attention_backward")


def attention_split(fn: Callable[[], object]) -> Dict[str, float]:
    """Seconds of one call's attention forward and backward (the
    operators above, torch.profiler's CPU time including their children),
    after a warm-up call."""
    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    times = {e.key: e.cpu_time_total / 1e6 for e in prof.key_averages()}
    return dict(forward=sum(times.get(op, 0.0) for op in FORWARD_OPS),
                backward=sum(times.get(op, 0.0) for op in BACKWARD_OPS))


def num_clusters(density: float) -> int:
    """V, the clusters of a sharp head of expected density about
    :obj:`density`: 0.8 / density, within 1 and k."""
    return max(1, min(CLUSTERS, round(INSIDE / density)))


def sharp_sbm(n: int, density: float, device: torch.device,
              seed: int = 0, sparse: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Memberships :obj:`[n, H, k]` (queries and keys alike) and a block
    :obj:`[H, k, k]` of V = round(0.8 / density) clusters, each token in one
    drawn at random, as leaves that take gradients. :obj:`sparse`: a
    token's other 0.02 on one more of the V clusters, drawn (on its own
    where V = 1), zero elsewhere, as the :obj:`"sharp"` parametrization's
    top-2 memberships are."""
    V = num_clusters(density)
    g = torch.Generator().manual_seed(seed)
    cluster = torch.randint(V, (n, HEADS, 1), generator=g)
    if sparse:
        memb = torch.zeros(n, HEADS, CLUSTERS)
        other = (cluster + torch.randint(1, max(V, 2), (n, HEADS, 1), generator=g)) % V
        memb.scatter_add_(2, other, torch.full((n, HEADS, 1), 1 - OWN))
        memb.scatter_add_(2, cluster, torch.full((n, HEADS, 1), OWN))
    else:
        memb = torch.full((n, HEADS, CLUSTERS), (1 - OWN) / (CLUSTERS - 1))
        memb.scatter_(2, cluster, OWN)
    block = torch.zeros(HEADS, CLUSTERS, CLUSTERS)
    block[:, torch.arange(V), torch.arange(V)] = INSIDE / OWN**2
    return tuple(t.to(device).requires_grad_() for t in (memb, block, memb.clone()))


def tile_figures(sbm: Tuple[Tensor, Tensor, Tensor], q: Tensor, k: Tensor,
                 v: Tensor, tile: int, gen: torch.Generator) -> dict:
    """The tiled path's figures on one draw (not timed): its tiles, their
    edges and the rest's, the density."""
    fixed = [t.detach() for t in sbm]
    plan = plan_tiles(*fixed, tile_q=tile, tile_k=tile, min_fill=MIN_FILL)
    with torch.no_grad():
        _, graph = tiled_sbm_attention(q, k, v, fixed, plan, mode="exact",
                                       generator=gen, return_graph=True)
    key, query = graph.edge_index
    tile_edges = int(in_tiles(plan, graph.head, query, key).sum())
    n = q.size(0)
    return dict(tiles=plan.num_tiles, tile_edges=tile_edges,
                rest_edges=graph.num_edges - tile_edges,
                tiled_density=graph.num_edges / (HEADS * n * n))


def bench_sharp(sizes: Sequence[Tuple[int, float]], device: torch.device,
                repeats: int, log, tile: int = TILE,
                dtype: torch.dtype = torch.float32) -> List[dict]:
    """One row per (n, density): the sharp head's fwd+bwd against SDPA's,
    the tiled path's with tiles of :obj:`tile` tokens; queries, keys and
    values (SDPA's too) in :obj:`dtype`, the SBM in float32."""
    rows = []
    # The edge path: the sparse kernel that "auto" would take, named.
    options = SBMAttentionOptions(
        mode="exact", attention_backend=resolve_backend("attention", "auto", device))
    chosen = SBMAttentionOptions(mode="exact")
    for n, density in sizes:
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in qkv(n, device))
        q4, k4, v4 = batched(q, k, v)
        sbm = sharp_sbm(n, density, device)
        gen = torch.Generator(device).manual_seed(0)
        last: dict = {}

        def run_sbm() -> None:
            res = sbm_attention(q, k, v, sbm, options=options, training=True,
                                generator=gen)
            last.update(density=float(res.sampled_density.mean()),
                        backends=dict(res.backends))
            backward(res.out, (q, k, v, *sbm))

        def run_auto() -> None:
            res = sbm_attention(q, k, v, sbm, options=chosen, training=True,
                                generator=gen)
            last.update(auto_backends=dict(res.backends))
            backward(res.out, (q, k, v, *sbm))

        def run_tiles() -> None:
            plan = plan_tiles(*(t.detach() for t in sbm), tile_q=tile,
                              tile_k=tile, min_fill=MIN_FILL)
            backward(tiled_sbm_attention(q, k, v, sbm, plan, mode="exact",
                                         generator=gen), (q, k, v, *sbm))

        # The sparse form (sharp_sbm's sparse memberships), over the clusters
        # its memberships use: "auto", and the edge path named.
        sparse = sharp_sbm(n, density, device, sparse=True)

        def run_sparse(name: str, opts: SBMAttentionOptions) -> Callable[[], None]:
            opts = dataclasses.replace(opts, sparse_memberships=True)

            def call() -> None:
                res = sbm_attention(q, k, v, sparse, options=opts, training=True,
                                    generator=gen)
                last[name] = (dict(res.backends), float(res.sampled_density.mean()))
                backward(res.out, (q, k, v, *sparse))
            return call

        def run_tiles_torch() -> None:
            fixed = [t.detach() for t in sbm]
            plan = plan_tiles(*fixed, tile_q=tile, tile_k=tile, min_fill=MIN_FILL)
            tiled = draw_tiled(*fixed, plan, mode="exact", generator=gen)
            backward(tiled_attention(q, k, v, tiled, sbm=sbm), (q, k, v, *sbm))

        times = median_times(dict(sbm=run_sbm, auto=run_auto, tiles=run_tiles,
                                  tiles_torch=run_tiles_torch,
                                  sparse_auto=run_sparse("sparse_auto", chosen),
                                  sparse_edges=run_sparse("sparse_edges", options),
                                  sdpa=lambda: run_sdpa(q4, k4, v4)),
                             device, repeats)
        last.update(tile_figures(sbm, q, k, v, tile, gen))
        row = dict(n=n, density=density, clusters=num_clusters(density),
                   dtype=str(dtype).replace("torch.", ""),
                   sampled_density=last["density"], backends=last["backends"],
                   sbm_time=times["sbm"], sdpa_time=times["sdpa"],
                   ratio=times["sbm"] / times["sdpa"],
                   auto_time=times["auto"], auto_ratio=times["auto"] / times["sdpa"],
                   auto_backends=last["auto_backends"],
                   tiles_time=times["tiles"],
                   tiles_ratio=times["tiles"] / times["sdpa"],
                   tiles_kernel="dense" if dense_runs(device) else "torch",
                   tiles_torch_time=times["tiles_torch"],
                   tiles_torch_ratio=times["tiles_torch"] / times["sdpa"],
                   tiles=last["tiles"], tiled_density=last["tiled_density"],
                   tile_fill=last["tile_edges"] / max(last["tiles"] * tile**2, 1),
                   rest_share=last["rest_edges"] / max(
                       last["rest_edges"] + last["tile_edges"], 1))
        for name in ("sparse_auto", "sparse_edges"):
            backends, sampled = last[name]
            row.update({f"{name}_time": times[name], f"{name}_backends": backends,
                        f"{name}_density": sampled,
                        f"{name}_ratio": times[name] / times["sdpa"]})
        log(f"  n={n:>6} target {density:<5} sampled {row['sampled_density']:.4f} "
            f"({row['backends']['sampler']}/{row['backends']['attention']}): "
            f"sbm_attention {row['sbm_time'] * 1e3:.1f} ms vs SDPA "
            f"{row['sdpa_time'] * 1e3:.1f} ms: {row['ratio']:.3f}x; auto "
            f"({row['auto_backends']['attention']}) {row['auto_ratio']:.3f}x; tiled "
            f"({row['tiles_kernel']}) {row['tiles_time'] * 1e3:.1f} ms "
            f"({row['tiles_ratio']:.3f}x; in PyTorch {row['tiles_torch_ratio']:.3f}x, "
            f"density {row['tiled_density']:.4f}, {row['tiles']} tiles filled "
            f"{row['tile_fill']:.2f}, rest {row['rest_share']:.3f} of the edges)")
        log(f"  sparse memberships (density {row['sparse_auto_density']:.4f}, "
            f"clusters {row['sparse_auto_backends']['clusters']}): auto "
            f"({row['sparse_auto_backends']['attention']}) "
            f"{row['sparse_auto_time'] * 1e3:.1f} ms, {row['sparse_auto_ratio']:.3f}x; "
            f"edge path {row['sparse_edges_ratio']:.3f}x")
        if device.type == "cpu":
            parts = breakdown(run_sbm, calls=1)
            row["breakdown"] = parts
            forward = parts["attention_forward"]
            row["backward_vs_forward"] = (parts["attention_backward"] / forward
                                          if forward > 0 else None)
            log(f"  parts: {format_breakdown(parts)}")
            split = attention_split(run_auto)
            row["auto_attention"] = split
            row["auto_backward_vs_forward"] = (split["backward"] / split["forward"]
                                               if split["forward"] > 0 else None)
            log(f"  auto's attention: forward {split['forward'] * 1e3:.1f} ms, "
                f"backward {split['backward'] * 1e3:.1f} ms")
            split = attention_split(run_sparse("sparse_auto", chosen))
            row["sparse_auto_attention"] = split
            row["sparse_auto_backward_vs_forward"] = (
                split["backward"] / split["forward"] if split["forward"] > 0 else None)
            log(f"  with sparse memberships: forward {split['forward'] * 1e3:.1f} ms, "
                f"backward {split['backward'] * 1e3:.1f} ms")
        rows.append(row)
    return rows


#: The sharp layer's construction: identity projections and MLP (its first
#: layer shifted past the ReLU), cluster u < V the unit vector e_u times
#: RADIUS, the others 0, and the block's offset, so that a token of cluster
#: c (SCALE e_c in its head's channels) has membership logit SCALE * RADIUS
#: = ln(0.98 (k - 1) / 0.02) on c and 0 elsewhere (membership 0.98), and
#: the block sigma(RADIUS^2 + OFFSET) = 0.8 / 0.98^2 inside a cluster,
#: sigma(OFFSET) across.
OFFSET = -9.0
RADIUS = math.sqrt(math.log(INSIDE / OWN**2 / (1 - INSIDE / OWN**2)) - OFFSET)
SCALE = math.log(OWN * (CLUSTERS - 1) / (1 - OWN)) / RADIUS


def sharp_conv(n: int, density: float, device: torch.device, seed: int = 0,
               attention_backend: str = "auto",
               parametrization: str = "mmsb") -> Tuple[SBMConv, Tensor]:
    """An :class:`~sbm_pyg.nn.SBMConv` (:obj:`"mmsb"`, no exploration, no
    root weight) and its input :obj:`[n, H d]` whose heads compute the
    sharp head of :func:`sharp_sbm` (memberships 0.98 on one of V clusters,
    p = 0.8 inside, about 1e-4 across) through the layer's own projections,
    MLP and clusters; V = round(0.8 / density) must not exceed the head
    dimension. The input takes gradients; :obj:`attention_backend` is the
    layer's. :obj:`parametrization="sharp"` builds it in the sharp form
    (key clusters the query clusters, temperature 1): a token's membership
    its top two clusters' softmax renormalized, about 0.9998 on its own and
    the rest on one other (one of the tied zero logits, as topk picks it),
    p about 0.83 inside a cluster; the layer computes over the clusters in
    use."""
    V = num_clusters(density)
    if V > HEAD_DIM:
        raise ValueError(f"density {density} needs {V} clusters, more than "
                         f"the head dimension {HEAD_DIM}")
    channels = HEADS * HEAD_DIM
    torch.manual_seed(seed)
    conv = SBMConv(channels, HEAD_DIM, heads=HEADS, num_clusters=CLUSTERS,
                   root_weight=False, exploration=0.0,
                   sbm_parametrization=parametrization,
                   attention_backend=attention_backend)
    sbm, eye = conv.sbm, torch.eye(HEAD_DIM)
    with torch.no_grad():
        for lin in (conv.lin_query, conv.lin_key):
            lin.weight.copy_(torch.eye(channels))
            lin.bias.zero_()
        sbm.weight1.copy_(eye)
        sbm.bias1.fill_(1.0)
        sbm.weight2.copy_(eye)
        sbm.bias2.fill_(-1.0)
        sbm.clusters.zero_()
        sbm.clusters[:, torch.arange(V), torch.arange(V)] = RADIUS
        sbm.block_bias.fill_(OFFSET)
        if sbm.key_clusters is not None and sbm.log_temperature is not None:
            sbm.key_clusters.copy_(sbm.clusters)
            sbm.log_temperature.zero_()
    g = torch.Generator().manual_seed(seed)
    cluster = torch.randint(V, (n, HEADS, 1), generator=g, device="cpu")
    x = torch.zeros(n, HEADS, HEAD_DIM, device="cpu").scatter_(2, cluster, SCALE)
    return conv.to(device), x.view(n, channels).to(device).requires_grad_()


def bench_sharp_conv(n: int, density: float, device: torch.device,
                     repeats: int, log) -> dict:
    """:func:`sharp_conv`'s layer fwd+bwd (every parameter's gradient and
    the input's) as :obj:`attention_backend="auto"` runs it and on the edge
    path, against :class:`torch.nn.MultiheadAttention` of the same width,
    in turns."""
    conv, x = sharp_conv(n, density, device)
    edges, _ = sharp_conv(n, density, device, attention_backend=resolve_backend(
        "attention", "auto", device))
    sharp_form, _ = sharp_conv(n, density, device, parametrization="sharp")
    mha = torch.nn.MultiheadAttention(x.size(1), HEADS, batch_first=True).to(device)
    gen = torch.Generator(device).manual_seed(0)
    ran: dict = {}

    def run(layer: SBMConv, name: str):
        def call() -> None:
            out = layer(x, generator=gen)
            ran[name] = (dict(layer.last_backends or {}),
                         float(layer.sampled_density.mean()))
            torch.autograd.grad(out.sum(), [x] + list(layer.parameters()))
        return call

    def run_mha() -> None:
        out, _ = mha(x[None], x[None], x[None], need_weights=False)
        torch.autograd.grad(out.sum(), [x] + list(mha.parameters()))

    times = median_times(dict(auto=run(conv, "auto"), edges=run(edges, "edges"),
                              sharp_form=run(sharp_form, "sharp_form"),
                              mha=run_mha), device, repeats)
    row = dict(n=n, density=density, clusters=num_clusters(density),
               mha_time=times["mha"])
    for name in ("auto", "edges", "sharp_form"):
        backends, sampled = ran[name]
        row.update({f"{name}_time": times[name], f"{name}_backends": backends,
                    f"{name}_density": sampled,
                    f"{name}_ratio": times[name] / times["mha"]})
    log(f"  SBMConv n={n} sharp at {density}: auto ({row['auto_backends']['attention']}, "
        f"density {row['auto_density']:.4f}) {row['auto_time'] * 1e3:.1f} ms, "
        f"{row['auto_ratio']:.3f}x MultiheadAttention ({row['mha_time'] * 1e3:.1f} ms); "
        f"edge path {row['edges_time'] * 1e3:.1f} ms, {row['edges_ratio']:.3f}x; the "
        f"sharp form ({row['sharp_form_backends']['attention']}, clusters "
        f"{row['sharp_form_backends']['clusters']}) {row['sharp_form_time'] * 1e3:.1f} ms, "
        f"{row['sharp_form_ratio']:.3f}x")
    return row


def bench_mixed(n: int, density: float, device: torch.device, repeats: int,
                log) -> dict:
    """A batch of both regimes: head 0 dense (one cluster, every pair at
    p = 0.9, above the device's crossover), head 1 the sharp head of
    :func:`sharp_sbm` with sparse memberships, through
    :func:`~sbm_pyg.nn.sbm_attention` (exact mode, ``sparse_memberships``)
    fwd+bwd against SDPA, in turns: under ``"auto"`` (the dense regime on
    head 0, the tiles on head 1), and with the tiles' fill out of reach
    (``tile_fill=1e9``: head 1 on the edge path, as a batch with dense pairs
    ran before the tiles were weighed beside them)."""
    q, k, v = (t.detach().requires_grad_() for t in qkv(n, device))
    q4, k4, v4 = batched(q, k, v)
    memb, block, _ = (t.detach() for t in sharp_sbm(n, density, device, sparse=True))
    memb[:, 0] = 0.0
    memb[:, 0, 0] = 1.0
    block[0] = 0.0
    block[0, 0, 0] = 0.9
    sbm = tuple(t.clone().requires_grad_() for t in (memb, block, memb))
    gen = torch.Generator(device).manual_seed(0)
    ran: dict = {}

    def run(name: str, fill: float) -> Callable[[], None]:
        opts = SBMAttentionOptions(mode="exact", sparse_memberships=True, tile_fill=fill)

        def call() -> None:
            res = sbm_attention(q, k, v, sbm, options=opts, training=True, generator=gen)
            ran[name] = dict(res.backends)
            backward(res.out, (q, k, v, *sbm))
        return call

    times = median_times(dict(tiles=run("tiles", MIN_FILL), edges=run("edges", 1e9),
                              sdpa=lambda: run_sdpa(q4, k4, v4)), device, repeats)
    row = dict(n=n, density=density, sdpa_time=times["sdpa"])
    for name in ("tiles", "edges"):
        row.update({f"{name}_time": times[name], f"{name}_backends": ran[name],
                    f"{name}_ratio": times[name] / times["sdpa"]})
    log(f"  n={n} head 0 dense, head 1 sharp at {density}: auto "
        f"({row['tiles_backends']['attention']}, dense pairs "
        f"{row['tiles_backends']['dense_pairs']}) {row['tiles_time'] * 1e3:.1f} ms, "
        f"{row['tiles_ratio']:.3f}x SDPA ({row['sdpa_time'] * 1e3:.1f} ms); head 1 "
        f"on the edge path {row['edges_time'] * 1e3:.1f} ms, {row['edges_ratio']:.3f}x")
    return row


def bench_widths(n: int, density: float, device: torch.device, repeats: int,
                 log) -> dict:
    """What the straight-through estimator's membership width costs the
    edge kernel: on one graph of the sharp head (the sparse form, drawn
    once), :func:`~sbm_pyg.nn.functional.sparse_attention` fwd+bwd with
    memberships of width 2 (the sparse form's two clusters a token), V
    (what :obj:`sparse_memberships` keeps) and k, and with edge
    probabilities alone (width 0), in turns; the kernels' own forward and
    backward (:func:`attention_split`) of each."""
    from sbm_pyg.nn.functional import sparse_attention
    from sbm_pyg.sampling import fastrg
    memb, block, _ = (t.detach() for t in sharp_sbm(n, density, device, sparse=True))
    graph = fastrg(memb, block, memb, generator=torch.Generator(device).manual_seed(0))
    q, k, v = qkv(n, device)
    V = num_clusters(density)
    g = torch.Generator(device).manual_seed(1)
    prob = torch.rand(graph.num_edges, generator=g, device=device).requires_grad_()

    def run(width: int) -> Callable[[], None]:
        sbm = tuple(torch.rand(*shape, generator=g, device=device).requires_grad_()
                    for shape in ((n, HEADS, width), (HEADS, width, width),
                                  (n, HEADS, width))) if width else None

        def call() -> None:
            out = sparse_attention(q, k, v, graph, None if sbm else prob, sbm=sbm)
            backward(out, [q, k, v, *(sbm or (prob,))])
        return call
    widths = (0, 2, V, CLUSTERS)
    calls = {f"width_{w}": run(w) for w in widths}
    times = median_times(calls, device, repeats)
    row = dict(n=n, density=density, edges=graph.num_edges, clusters=V,
               times={w: times[f"width_{w}"] for w in widths},
               attention={w: attention_split(calls[f"width_{w}"]) for w in widths})
    log(f"  edge kernel on the sharp graph (n={n}, {density}): fwd+bwd / its "
        f"backward by membership width: " + ", ".join(
            f"{w}: {row['times'][w] * 1e3:.1f} / "
            f"{row['attention'][w]['backward'] * 1e3:.1f} ms" for w in widths))
    return row


def sharp_section(cases: Sequence[Tuple[int, float]], conv_case: Tuple[int, float],
                  device: torch.device, repeats: int, dtype: torch.dtype,
                  log) -> dict:
    """The suite's ``sharp`` section: :func:`bench_sharp` on :obj:`cases`
    (queries, keys and values in :obj:`dtype`) and :func:`bench_sharp_conv`
    on :obj:`conv_case`, as the results' ``sharp`` and ``sharp_conv``."""
    log(f"\n[sharp] a sharp head (memberships {OWN} on one of V clusters, p = "
        f"{INSIDE} inside a cluster) through sbm_attention, exact mode, "
        f"fwd+bwd with the straight-through gradients, vs SDPA")
    rows = bench_sharp(cases, device, repeats, log, dtype=dtype)
    log("  the layer: SBMConv whose heads are that head, fwd+bwd, vs "
        "MultiheadAttention")
    conv = bench_sharp_conv(*conv_case, device, repeats, log)
    log("  a batch of both regimes: a dense head beside the sharp one, fwd+bwd, vs SDPA")
    return dict(sharp=rows, sharp_conv=conv,
                sharp_mixed=bench_mixed(*conv_case, device, repeats, log))


def sharp_sections(sections: Sequence[str], cases: Sequence[Tuple[int, float]],
                   conv_case: Tuple[int, float], widths_case: Tuple[int, float],
                   device: torch.device, repeats: int, dtype: torch.dtype,
                   log) -> dict:
    """The suite's ``sharp`` section (:func:`sharp_section`) and its
    ``widths`` section (:func:`bench_widths` on :obj:`widths_case`), those
    of them in :obj:`sections`."""
    results = {}
    if "sharp" in sections:
        results.update(sharp_section(cases, conv_case, device, repeats, dtype, log))
    if "widths" in sections:
        log("\n[widths] the edge kernel on one graph of the sharp head, fwd+bwd "
            "with the straight-through gradients, by membership width")
        results["widths"] = bench_widths(*widths_case, device, repeats, log)
    return results
