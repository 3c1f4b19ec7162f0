"""The C++ sampler's work model: each stage's measured time (`stages.json`,
written by `../sampler-stages/measure.py` on this tree's sampler) against a
floor made of its memory work (the counts below, read off
`csrc/sampler/fastrg.cpp`) at the machine's measured rates
(`floors.json`, `floors.c`). Writes `model.json`.

    python docs/runs/cpu/sampler-work-model/model.py

The floors take every stream at the memory's copy rate (an upper bound
where a chunk's scratch stays in the last-level cache) and leave out the
arithmetic (the streams' SplitMix words, the cluster pick, the bitmap):
what a stage costs above its floor is arithmetic, latency the prefetches
do not hide, or work the kernel need not do.
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Per draw, the grouped path (`draw_chunk`, sequences of >= 2048 keys), by
# what it touches: bytes streamed, random reads of one key table (192 KiB,
# the L2) and random stores into the chunk's 4-byte slots (2.7-4.2 MB a
# thread on 2 threads: the L3).
ROWS = dict(
    streamed_bytes=12      # first pass: a draw's group (4) and word (8) written
    + 28                   # counting sort: group read twice, word read, word and slot written
    + 12                   # resolve: word and slot read
    + 8                    # row(): the row's draws copied to its list
    + 16,                  # a kept key pushed to keys, to out, and out copied once more (per edge)
    table_reads=2,         # the guide, then the cumulative weights it points at (dependent)
    slot_stores=1)         # code[slot] = key: back to the draw's place in its row
# Per edge: the column order's two passes (`omp_fn.2`).
SORT = dict(streamed_bytes=4 + 4 + 8 + 8,  # histogram read; pass 1 read, write; pass 2 read
            bucket_stores=2)               # pass 2's writes of perm and row within a bucket (L2)
# Per call: the key tables of every (head, cluster): cum (8 B) and guide
# (4 B) per key written, the key memberships read twice.
TABLES_BYTES = lambda H, k, n: H * k * n * 12 + 2 * n * H * k * 4  # noqa: E731


def main() -> None:
    floors = json.loads((HERE / "floors.json").read_text())
    stages = json.loads((HERE / "stages.json").read_text())
    byte_ns = 1.0 / floors["stream_copy_GBps"]  # ns a byte, both threads
    rows = []
    for case in stages["rows"]:
        ms, shares = case["ms"], case["profile"]["shares"]
        draws, edges = case["draws"], case["edges"]

        def measured(stage: str) -> float:
            return ms * shares.get(stage, 0.0) / 100

        rows_floor = draws * (ROWS["streamed_bytes"] * byte_ns
                              + ROWS["table_reads"] * floors["gather_192KiB_ns"]
                              + ROWS["slot_stores"] * floors["scatter_4MiB_ns"]) / 1e6
        sort_floor = edges * (SORT["streamed_bytes"] * byte_ns
                              + SORT["bucket_stores"] * floors["gather_192KiB_ns"]) / 1e6
        tables_floor = TABLES_BYTES(case["heads"], case["clusters"], case["n"]) * byte_ns / 1e6
        stages_out = {}
        for name, stage, floor in (
                ("rows: draws and merge", "rows: draws and merge", rows_floor),
                ("column order", "column order (counting sort)", sort_floor),
                ("key tables", "key tables", tables_floor),
                ("page faults", "kernel (page faults, zeroing)", 0.0)):
            t = measured(stage)
            stages_out[name] = dict(ms=round(t, 1), floor_ms=round(floor, 1),
                                    times_floor=round(t / floor, 2) if floor else None)
        per_draw = measured("rows: draws and merge") * 1e6 / draws
        rows.append(dict(
            density=case["density"], mode=case["mode"], ms=round(ms, 1),
            edges=edges, draws=draws, m_edges_per_s=round(edges / ms / 1e3, 1),
            rows_ns_per_draw=round(per_draw, 2),
            rows_floor_ns_per_draw=dict(
                streams=round(ROWS["streamed_bytes"] * byte_ns, 2),
                table_reads=round(ROWS["table_reads"] * floors["gather_192KiB_ns"], 2),
                slot_store=round(ROWS["slot_stores"] * floors["scatter_4MiB_ns"], 2)),
            stages=stages_out))
    out = dict(command="python docs/runs/cpu/sampler-work-model/model.py",
               work=dict(rows_per_draw=ROWS, sort_per_edge=SORT), rows=rows)
    (HERE / "model.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
