"""Hand-worked metric examples (ranks, false_rate, drops, choice rules with ties)."""
from types import SimpleNamespace

import numpy as np
import pytest

from hardrank.scoring.metrics import add_drops, average_views, choice_metrics, ranking_metrics, recall_metrics
from hardrank.tasks import ChoiceTask, RankingTask


def _task():
    # gallery: original [0,1,2,3], variant "v" [4,5]
    return RankingTask(name="i2t", query_modality="image", query_items=np.arange(3), query_ids=["q0", "q1", "q2"],
                       groups=["original", "v"], group_bounds=np.array([0, 4, 6]), gallery_items=np.arange(6),
                       gallery_ids=[f"g{i}" for i in range(6)], pos_ptr=np.array([0, 1, 2, 3]),
                       pos_idx=np.array([0, 1, 2]),
                       views={"original": ["original"], "v": ["original", "v"]})


def test_ranking_metrics_hand_worked():
    # q0: nothing beats its positive anywhere -> rank 0 in both views
    # q1: 2 originals beat it, 1 variant item beats it -> rank 2 (original), 3 (v); top-1 in v is the variant item
    # q2: 0 originals, 1 variant -> rank 0 / 1; top-1 of v = variant item 5 (false)
    r = SimpleNamespace(
        counts=np.array([[0, 0], [2, 1], [0, 1]]), pos_index=np.array([0, 1, 2]),
        neg_score=np.array([[0.1, 0.2], [0.8, 0.9], [0.3, 0.7]]),
        neg_index=np.array([[1, 4], [3, 5], [0, 5]]))
    m, o = ranking_metrics(_task(), r)
    assert o["original"]["rank"].tolist() == [0, 2, 0]
    assert o["v"]["rank"].tolist() == [0, 3, 1]
    assert m["original"]["R@1"] == pytest.approx(200 / 3)
    assert m["v"]["R@1"] == pytest.approx(100 / 3)
    assert m["v"]["R@5"] == 100.0
    assert o["v"]["top1"].tolist() == [0, 5, 5]
    assert m["v"]["false_rate"] == pytest.approx(200 / 3)
    assert "false_rate" not in m["original"]
    assert m["v"]["mean_rank"] == pytest.approx((1 + 4 + 2) / 3)
    assert m["v"]["median_rank"] == 2


def test_top1_ties_across_groups_go_to_lower_index():
    t = _task()
    r = SimpleNamespace(counts=np.array([[1, 1], [1, 0], [0, 0]]), pos_index=np.array([0, 1, 2]),
                        neg_score=np.array([[0.5, 0.5], [0.5, -np.inf], [0.0, 0.0]]),
                        neg_index=np.array([[3, 4], [2, -1], [1, 4]]))
    _, o = ranking_metrics(t, r)
    assert o["v"]["top1"].tolist() == [3, 2, 2]   # equal scores: original (lower index) wins
    assert o["v"]["top1_group"].tolist() == [0, 0, 0]


def test_recall_empty_and_drops_and_average():
    assert np.isnan(recall_metrics(np.array([], dtype=int))["R@1"])
    m = {"original": {"i2t": {"R@1": 50.0, "R@5": 80.0, "R@10": 90.0}},
         "v_s1": {"i2t": {"R@1": 30.0, "R@5": 70.0, "R@10": 90.0, "false_rate": 10.0}},
         "v_s2": {"i2t": {"R@1": 20.0, "R@5": 60.0, "R@10": 80.0, "false_rate": 30.0}}}
    add_drops(m)
    assert m["v_s1"]["i2t"]["drop"] == {"R@1": 20.0, "R@5": 10.0, "R@10": 0.0}
    average_views(m, {"v": ["v_s1", "v_s2"]})
    assert m["v"]["i2t"]["R@1"] == 25.0 and m["v"]["i2t"]["false_rate"] == 20.0


def _choice(rule, n, a, b, subset=None):
    return ChoiceTask(name="t", rule=rule, left_modality="image", right_modality="text",
                      left=np.zeros((n, a), int), right=np.zeros((n, b), int), ids=[str(i) for i in range(n)],
                      subset=subset)


def test_first_strict_and_first_ties_win():
    s = np.array([[[0.9, 0.1]], [[0.5, 0.5]], [[0.2, 0.3]]])
    m, v = choice_metrics(_choice("first_strict", 3, 1, 2, ["a", "a", "b"]), s)
    assert v["correct"].tolist() == [True, False, False]   # tie is wrong
    assert m["all"]["accuracy"] == pytest.approx(100 / 3) and m["all"]["ties"] == 1
    assert m["a"]["accuracy"] == 50.0 and m["b"]["accuracy"] == 0.0
    m2, v2 = choice_metrics(_choice("first_ties_win", 3, 1, 2), s)
    assert v2["correct"].tolist() == [True, True, False]   # ARO order: tie goes to the original


def test_triplet_hard_positive_metrics():
    # (c, c_P, c_N)
    s = np.array([[[0.9, 0.8, 0.1]],   # c > p > n : original, augmented
                  [[0.9, 0.1, 0.5]],   # c > n > p : original, brittle
                  [[0.2, 0.9, 0.5]],   # p > n > c : neither
                  [[0.5, 0.7, 0.5]]])  # c == n : tie, original wrong
    m, v = choice_metrics(_choice("triplet", 4, 1, 3), s)
    assert v["original"].tolist() == [True, True, False, False]
    assert v["augmented"].tolist() == [True, False, False, False]
    assert v["brittle"].tolist() == [False, True, False, False]
    a = m["all"]
    assert (a["original_accuracy"], a["augmented_accuracy"], a["brittleness"], a["ties"]) == (50.0, 25.0, 25.0, 1)
    assert a["orderings"] == {"c_and_p_gt_n": 1, "c_gt_n_gt_p": 1, "p_gt_n_gt_c": 1, "n_gt_c_and_p": 0}


def test_grid2x2_winoground_scores():
    # s[i_image, j_text]
    s = np.array([[[0.9, 0.1], [0.2, 0.8]],   # all correct
                  [[0.9, 0.1], [0.85, 0.8]],  # image1 prefers text0 -> text score fails; t2i ok
                  [[0.5, 0.1], [0.5, 0.8]]])  # text0 tie between images -> image score fails
    m, v = choice_metrics(_choice("grid2x2", 3, 2, 2, ["color", "size", "color"]), s)
    assert v["text"].tolist() == [True, False, True]
    assert v["image"].tolist() == [True, True, False]
    assert v["group"].tolist() == [True, False, False]
    assert m["all"]["i2t_accuracy"] == pytest.approx(500 / 6)
    assert m["all"]["t2i_accuracy"] == pytest.approx(500 / 6)
    assert m["color"]["group_score"] == 50.0 and m["size"]["items"] == 1
