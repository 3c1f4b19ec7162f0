import pytest

from sbm_pyg.experiments.sbm_fit import fit_equal_token_graph


def test_placed_memberships_show_the_cap_and_its_absence():
    # The right partition given (each value its own cluster), only the
    # block learned: the paper's block matrix shares one unit of mass over
    # the N = 12 blocks (p_same <= 1/12 + what the sigmoid's overlap allows),
    # the mixed-membership one makes every block dense.
    kwargs = dict(seq_len=12, num_clusters=12, channels=8, steps=300)
    paper = fit_equal_token_graph("paper", "placed", **kwargs)
    mmsb = fit_equal_token_graph("mmsb", "placed", **kwargs)
    assert paper["p_same"] < 1.05 / 12
    assert mmsb["p_same"] > 0.95 and mmsb["p_other"] < 0.05


def test_bad_arguments():
    with pytest.raises(ValueError, match="parametrization"):
        fit_equal_token_graph("rate", "placed")
    with pytest.raises(ValueError, match="start"):
        fit_equal_token_graph("mmsb", "nowhere")
    with pytest.raises(ValueError, match="num_clusters"):
        fit_equal_token_graph("mmsb", "placed", seq_len=16, num_clusters=8)
