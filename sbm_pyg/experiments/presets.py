r"""The named experiments of ``python -m sbm_pyg train --preset``: the
argument defaults each sets (the command line overrides them), what a
budgeted run of a preset adds, and the exploration rate a budget implies."""
from __future__ import annotations

from typing import Dict, Optional

# The exploration's rule lives with the layer's options; named here too, as
# the experiments have always imported it from here.
from sbm_pyg.nn.options import EXPLORATION, EXPLORATION_SHARE, default_exploration

__all__ = ["PRESETS", "BUDGET_PRESETS", "EXPLORATION", "EXPLORATION_SHARE",
           "default_exploration", "preset_defaults"]

#: Named experiments for ``--preset``: argument defaults that the command line
#: can still override (e.g. ``--preset repeat-paper --seq-len 64``).
PRESETS: Dict[str, dict] = {
    # The paper's "finding repeated tokens" (Sec. 5.1): N = 256, one layer,
    # one head, width 32, k = 128, batch 256, lr 1e-3, 2000 steps, with the
    # published experiments' exploration 0.01 and no density penalty. The
    # heads start dense (--sbm-init dense): from the published code's start
    # (about 25% of the pairs, --sbm-init paper) the head drives itself to
    # full attention as the paper's Figure 4 shows, but the model first
    # trains for hundreds of steps on a sparse random graph, and on most
    # seeds at N = 32 and 128 (one of three at N = 64) it then stalls below
    # 99% with the head dense; from the dense start the same seeds learn
    # the task (docs/experiments.md).
    # The optimizer is the published code's (the paper does not name one):
    # AdamW, no weight decay, linear decay to 0; but eps 1e-8 (torch's), as
    # its 1e-6 froze the SBM here (docs/experiments.md). The warm-up of 100
    # steps (5%) is ours, in the range of the published LRA runs' (0.5-40%).
    "repeat-paper": dict(task="repeat", attention="sbm", seq_len=256,
                         num_layers=1, heads=1, channels=32, num_clusters=128,
                         batch_size=256, lr=1e-3, steps=2000, lam=0.0,
                         mode="exact", ste="paper", sbm_init="dense",
                         optimizer="adamw",
                         adam_eps=1e-8, weight_decay=0.0, schedule="linear",
                         warmup_steps=100, clip_grad_norm=0.0),
    # LRA ListOps (Appendix C, Table 5, and the published code's LRA
    # configuration): 2 layers, 2 heads of 32 channels, width 64, MLP 128,
    # dropout 0.1, sequences up to 2000 tokens, batch 128, lr 5e-4, 5000
    # steps with 1000 of warm-up then linear decay, AdamW without weight
    # decay (eps as repeat-paper's), k = 128, no density penalty. The data are generated
    # here (LRA's lengths: 500 to 2000 tokens), fewer than LRA's 96,000
    # training sequences unless --listops-sizes asks for them.
    "listops-paper": dict(task="listops", attention="sbm", seq_len=2000,
                          num_layers=2, heads=2, channels=64, num_clusters=128,
                          dropout=0.1, batch_size=128, lr=5e-4, steps=5000,
                          lam=0.0, mode="exact", ste="paper",
                          optimizer="adamw", adam_eps=1e-8, weight_decay=0.0,
                          schedule="linear", warmup_steps=1000,
                          clip_grad_norm=0.0, listops_min_length=500),
}
# The sparse heads' recipe (docs/experiments.md, "Sparse and right, take
# three"): the cap-free parametrization from the published start, a budget
# of 5%, and the teacher recipe: the model learns the task on every pair,
# then the SBMs alone learn its attention, frozen, under the budget until
# their recall is ready, then everything trains on sampled graphs.
# --seq-len, --target-density and --seed override.
_SPARSE = dict(attention="sbm", sbm_parametrization="mmsb", sbm_init="paper",
               recipe="teacher", target_density=0.05, distill=1.0, sbm_lr=1e-2,
               selector_steps=400, selector_recall=0.9, selector_check=25)
# The gradual switch (400 of its 800 sampled steps) took the three seeds
# from 73.2 / 95.7 / 63.5% to 89.6 / 97.8 / 78.3% (docs/runs/teacher). On
# all three the frozen model on the selector's graphs sat at the majority
# class when it switched, and the dense phase had not learned the task when
# the selector began: so the dense phase waits for the teacher (99%), the
# sink is in the model from the start (a row learns "no copy" as the sink,
# not as a spread), and the switch waits until the frozen model on the
# selector's graphs is within a point of the teacher, for up to 1200 steps
# (the dense phase waits until step 4000 at the latest). After the switch
# the task's gradient pulls the density down, and a floor starting from
# lambda 0.001 came back too late (3.2% at the end of 3000 steps on seed 1,
# its lambda 21 by then): the floor starts from 1, as MQAR's. Seed 2's
# teacher sat on a plateau near 90% until step 1600, the dense phase's first
# cap (90.49% there, the run 91.25%); with the gradient clipped at norm 1,
# 6000 steps and the cap at step 4000 it passed the gate at step 1875 and
# the run scored 99.99%, seeds 0 and 1 99.97% and 99.99% (docs/runs/teacher,
# repeat64-preset-clip1-dense4000-s*).
PRESETS["repeat-sparse"] = dict(PRESETS["repeat-paper"], **dict(
    _SPARSE, seq_len=64, dense_steps=800, budget_warmup=200, switch_steps=400,
    teacher_accuracy=0.99, dense_max_steps=4000, sink=True, switch_within=0.01,
    selector_steps=1200, steps=6000, budget_lam=1.0, clip_grad_norm=1.0))
# MQAR at Zoology's evaluation setting (Arora et al., 2023): N = 256, 64
# key-value pairs, a vocabulary of 8192 (chance 1/4096), a short convolution
# before each attention, 2 layers of 2 heads, width 64, batch 64, lr 3e-3
# with 100 warm-up steps and a linear decay. Full attention learns it by
# step 1750 of 4000 (docs/runs/mqar-zoology/full-s0).
_ZOOLOGY = dict(task="mqar", seq_len=256, num_pairs=64, vocab_size=8192, short_conv=3,
                num_layers=2, heads=2, channels=64, num_clusters=128, batch_size=64,
                lr=3e-3, warmup_steps=100, steps=4000, eval_batches=8,
                optimizer="adamw", adam_eps=1e-8, weight_decay=0.0,
                schedule="linear", clip_grad_norm=0.0)
PRESETS["mqar-full"] = dict(_ZOOLOGY, attention="full")
# BigBird's pattern at 5% (window, global and random keys in equal shares).
PRESETS["mqar-bigbird"] = dict(_ZOOLOGY, attention="bigbird", bigbird_density=0.05)
# The selector's control: an SBM at the same density that never learns
# (--sbm-lr 0, no straight-through gradient, no density loss), its graphs a
# fixed random function of the queries and keys; the same dense warm-up as
# the learned selector's teacher before its graphs take over.
PRESETS["mqar-random"] = dict(_ZOOLOGY, attention="sbm", sbm_parametrization="mmsb",
                              init_density=0.05, sbm_lr=0.0, ste="none",
                              mode="exact", dense_steps=2000, steps=4500)
# The learned selector at 5% (docs/experiments.md, "Sparse and right"): the
# teacher recipe with the teacher's rows' recall in the distillation, every
# head held to the budget from a multiplier of 1, the SBMs learning from the
# selector phase on, a sink. The dense phase waits for the teacher to reach
# 99% (from step 500, by step 3000 at the latest); 4500 steps in all.
_MQAR_SPARSE = dict(
    _SPARSE, dense_steps=500, budget_warmup=150, mode="exact", ste="paper", sink=True,
    distill_recall=1.0, budget_per_head=True, budget_lam=1.0, distill_start=500,
    teacher_accuracy=0.99)
PRESETS["mqar-sparse"] = dict(_ZOOLOGY, **dict(_MQAR_SPARSE, selector_steps=2500),
                              steps=4500)
# The easy variant of the same recipe (docs/runs/mqar256): 16 pairs of a
# 256-symbol vocabulary at N = 256 (every key can own a cluster; chance
# 1/128), 2100 steps; 98.78% at 5% on seed 0 (docs/runs/teacher).
PRESETS["mqar-sparse-easy"] = dict(
    PRESETS["mqar-sparse"], num_pairs=16, vocab_size=256, small_vocab=True,
    selector_steps=1500, steps=2100)


# Masked-byte modelling on the Python sources of the pinned torch
# (sbm_pyg.experiments.text): sequences of 1024 bytes, 15% masked, 2 layers
# of 2 heads, width 64 with the short convolution, batch 16, lr 3e-3,
# 1500 steps (what two CPU cores allow; docs/runs/mlm).
_MLM = dict(task="mlm", seq_len=1024, num_layers=2, heads=2, channels=64,
            num_clusters=128, short_conv=3, batch_size=16, lr=3e-3, warmup_steps=100,
            steps=1500, eval_batches=8, optimizer="adamw", adam_eps=1e-8,
            weight_decay=0.0, schedule="linear", clip_grad_norm=0.0)
PRESETS["mlm-full"] = dict(_MLM, attention="full")
PRESETS["mlm-bigbird"] = dict(_MLM, attention="bigbird", bigbird_density=0.05)
# The learned selector: MQAR's recipe without the accuracy gate (no byte
# model nears 99%): 600 dense steps, up to 300 selector steps.
PRESETS["mlm-sparse"] = dict(_MLM, **dict(_MQAR_SPARSE, teacher_accuracy=0.0,
                                          dense_steps=600, distill_start=600,
                                          selector_steps=300))
# The random selector, its dense phase as long as the learned one's at the
# latest (600 + 300 steps).
PRESETS["mlm-random"] = dict(_MLM, attention="sbm", sbm_parametrization="mmsb",
                             init_density=0.05, sbm_lr=0.0, ste="none", mode="exact",
                             dense_steps=900)


#: What a preset adds when a run holds its heads to a budget
#: (``--target-density``): defaults again, which the command line overrides.
#: A head held sparse from the start learns nothing of the repeat task (its
#: accuracy stays at the majority class); a dense warm-up with the attention
#: distillation lets the attention learn the task on every pair while the
#: SBM learns where it goes, and only then does the budget take the pairs
#: away (docs/experiments.md, "Sparse and right").
BUDGET_PRESETS: Dict[str, dict] = {
    "repeat-paper": dict(distill=1.0, dense_steps=800, budget_warmup=400,
                         sbm_lr=1e-2),
}


def preset_defaults(preset: Optional[str], target_density: Optional[float]) -> dict:
    """The defaults of :obj:`preset` (none for :obj:`None`), with its
    :data:`BUDGET_PRESETS` entry where a :obj:`target_density` is given."""
    if preset is None:
        return {}
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    extra = BUDGET_PRESETS.get(preset, {}) if target_density is not None else {}
    return {**PRESETS[preset], **extra}
