"""Rows bounded by tokens and by cost (image patches): literal cases, the two-limit engines against
one-item-at-a-time references, properties over every strategy and overlong policy, error messages."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padless.planning import costs as costs_mod
from padless.planning.costs import check_costs, micro_batch_costs, row_costs
from padless.planning.plan import DEPRECATED_STRATEGIES, OVERLONG_POLICIES, STRATEGIES, PackPlan, plan_packs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import ref_best_fit_decreasing, ref_next_fit, ref_wrapped  # noqa: E402

CURRENT_STRATEGIES = tuple(s for s in STRATEGIES if s not in DEPRECATED_STRATEGIES)  # no deprecated name

FAST = settings(max_examples=60, deadline=None)
ARRAYS = ("index", "start", "length", "row_offsets", "dropped", "truncated")


def rows_of(plan: PackPlan) -> list[list[int]]:
    return [r.tolist() for r in plan.rows()]


def pieces_of(plan: PackPlan) -> list[list[tuple[int, int, int]]]:
    return [list(zip(*(a.tolist() for a in plan.row(r)))) for r in range(plan.num_rows)]


# ------------------------------------------------------------------ references: one item at a time


def ref_bfd_2d(sizes, costs, cap, max_cost, per_row):
    """Dominant share descending (exact fractions, ties by index); into the fitting row with the
    fewest free tokens, ties to the lowest row; else a new row."""
    rows: list[list[int]] = []
    free: list[list[int]] = []  # per row: tokens, cost, slots left
    share = [max(Fraction(s, cap), Fraction(c, max_cost)) for s, c in zip(sizes, costs)]
    for i in sorted(range(len(sizes)), key=lambda i: (-share[i], i)):
        fit = [r for r, (t, c, k) in enumerate(free) if t >= sizes[i] and c >= costs[i] and k > 0]
        if fit:
            r = min(fit, key=lambda r: (free[r][0], r))
        else:
            r = len(rows)
            rows.append([])
            free.append([cap, max_cost, per_row or len(sizes) + 1])
        rows[r].append(i)
        free[r] = [free[r][0] - sizes[i], free[r][1] - costs[i], free[r][2] - 1]
    return rows


def ref_next_fit_2d(sizes, costs, cap, max_cost, per_row):
    rows: list[list[int]] = []
    for i, (s, c) in enumerate(zip(sizes, costs)):
        last = rows[-1] if rows else None
        if (
            last is not None
            and sum(sizes[j] for j in last) + s <= cap
            and sum(costs[j] for j in last) + c <= max_cost
            and (per_row is None or len(last) < per_row)
        ):
            last.append(i)
        else:
            rows.append([i])
    return rows


def ref_wrapped_2d(sizes, costs, cap, max_cost, per_row):
    """Token pieces one at a time; an item with cost goes whole, into a new row if it misses this one."""
    rows: list[list[tuple[int, int, int]]] = [[]]
    room, spent = cap, 0
    for i, (s, c) in enumerate(zip(sizes, costs)):
        full = per_row is not None and len(rows[-1]) == per_row
        if c:
            if s > room or (max_cost is not None and spent + c > max_cost) or full:
                rows.append([])
                room, spent = cap, 0
            rows[-1].append((i, 0, s))
            room, spent = room - s, spent + c
            continue
        done = 0
        while done < s:
            if room == 0 or (per_row is not None and len(rows[-1]) == per_row):
                rows.append([])
                room, spent = cap, 0
            take = min(room, s - done)
            rows[-1].append((i, done, take))
            done, room = done + take, room - take
    return [r for r in rows if r]


# ---------------------------------------------------------------------------------- literal cases


def test_docstring_example():
    plan = plan_packs([6, 6, 2, 2], 8, costs=[9, 9, 0, 0], max_cost=10)
    assert rows_of(plan) == [[0, 2], [1, 3]]
    assert row_costs(plan, [9, 9, 0, 0]).tolist() == [9, 9]
    assert plan.row_lengths.tolist() == [8, 8]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("next_fit", [[0, 1], [2, 3]]),
        ("best_fit_decreasing", [[0, 1], [2, 3]]),
        ("histogram_best_fit", [[0, 1], [2, 3]]),
        ("wrapped", [[0, 1], [2, 3]]),
    ],
)
def test_the_cost_limit_opens_rows_that_tokens_would_not(strategy, expected):
    lengths, costs = [2, 2, 2, 2], [5, 5, 5, 5]
    assert [sorted(r) for r in rows_of(plan_packs(lengths, 8, strategy=strategy))] == [[0, 1, 2, 3]]  # one row
    plan = plan_packs(lengths, 8, strategy=strategy, costs=costs, max_cost=10)
    assert rows_of(plan) == expected
    assert row_costs(plan, costs).tolist() == [10, 10]


def test_wrapped_never_cuts_a_document_with_images():
    plan = plan_packs([6, 6, 2, 5], 8, strategy="wrapped", costs=[9, 9, 0, 0], max_cost=10)
    # seq 1 (cost 9) would go to row 0's last 2 tokens and cost: it opens row 1; text seq 3 is cut
    assert pieces_of(plan) == [[(0, 0, 6)], [(1, 0, 6), (2, 0, 2)], [(3, 0, 5)]]
    plan = plan_packs([6, 6, 2, 5], 8, strategy="wrapped", costs=[0, 9, 0, 0])
    assert pieces_of(plan) == [[(0, 0, 6)], [(1, 0, 6), (2, 0, 2)], [(3, 0, 5)]]
    plan = plan_packs([6, 6, 2, 5], 8, strategy="wrapped", costs=[0, 0, 0, 0])
    assert pieces_of(plan) == [[(0, 0, 6), (1, 0, 2)], [(1, 2, 4), (2, 0, 2), (3, 0, 2)], [(3, 2, 3)]]


def test_a_cost_over_max_cost_is_dropped_and_counted():
    lengths, costs = [3, 4, 5, 20], [2, 12, 0, 1]
    plan = plan_packs(lengths, 8, costs=costs, max_cost=10, overlong="drop")
    assert plan.dropped.tolist() == [1, 3]  # seq 1 by cost, seq 3 by length
    assert (plan.stats.dropped_sequences, plan.stats.dropped_tokens) == (2, 24)
    assert sorted(plan.index.tolist()) == [0, 2]
    check_costs(plan, lengths, costs, 10)


@pytest.mark.parametrize("overlong", ["error", "truncate", "split"])
def test_a_cost_over_max_cost_is_refused_otherwise(overlong):
    with pytest.raises(
        ValueError, match=r"sequence 1 has cost 12, more than max_cost 10 \(and 1 more\); .*overlong='drop'"
    ):
        plan_packs([3, 4, 5], 8, costs=[2, 12, 11], max_cost=10, overlong=overlong)


@pytest.mark.parametrize("overlong", ["truncate", "split"])
@pytest.mark.parametrize("max_cost", [None, 50])
def test_a_long_document_with_images_is_not_cut(overlong, max_cost):
    message = r"sequence 2 has length 9, longer than max_length 8, and cost 3: overlong='%s' would cut" % overlong
    with pytest.raises(ValueError, match=message):
        plan_packs([3, 12, 9], 8, costs=[0, 0, 3], max_cost=max_cost, overlong=overlong)
    plan = plan_packs([3, 12, 9], 8, costs=[0, 0, 3], max_cost=max_cost, overlong="drop")
    assert plan.dropped.tolist() == [1, 2]
    # a long text-only sequence keeps its policy
    plan = plan_packs([3, 12, 5], 8, costs=[4, 0, 3], max_cost=max_cost, overlong=overlong)
    check_costs(plan, [3, 12, 5], [4, 0, 3], max_cost)
    assert plan.truncated.tolist() == ([1] if overlong == "truncate" else [])


def test_error_policy_keeps_its_length_message():
    with pytest.raises(ValueError, match="sequence 2 has length 12, longer than max_length 8"):
        plan_packs([3, 12], 8, costs=[0, 0], max_cost=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_cost": 5}, "max_cost=5 needs costs: pass costs="),
        ({"costs": [1, 2, 3]}, "costs has 3 entries but lengths has 2; give one cost per sequence"),
        ({"costs": [1, -2]}, r"costs\[1\] = -2; a cost \(image patches\) must be >= 0"),
        ({"costs": [1, 2.5]}, r"costs\[1\] = 2.5"),
        ({"costs": [True, False]}, "booleans"),
        ({"costs": ["a", "b"]}, "costs must be integers"),
        ({"costs": [[1, 2]]}, "costs must be one-dimensional"),
        ({"costs": [1, 2], "max_cost": 0}, "max_cost must be an integer >= 1"),
        ({"costs": [1, 2], "max_cost": 2.5}, "max_cost must be an integer"),
    ],
)
def test_bad_cost_arguments_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_packs([4, 2], 8, **kwargs)


def test_row_costs_refuses_a_plan_that_cut_images():
    plan = plan_packs([12, 3], 8, overlong="split")  # planned without costs: seq 0 is split
    with pytest.raises(ValueError, match="the plan cuts sequence 0, which has cost 4"):
        row_costs(plan, [4, 0])
    assert row_costs(plan, [0, 7]).tolist() == [0, 7]  # text-only pieces cost nothing


def test_check_costs_names_the_row_over_max_cost():
    plan = plan_packs([2, 2, 2, 2], 8)
    with pytest.raises(ValueError, match="row 0 holds cost 20 > max_cost 10"):
        check_costs(plan, [2, 2, 2, 2], [5, 5, 5, 5], 10)


def test_micro_batch_costs_sum_consecutive_rows():
    lengths, costs = [8, 8, 8, 8, 8], [1, 2, 3, 4, 5]
    plan = plan_packs(lengths, 8, strategy="next_fit", costs=costs, max_cost=5)
    assert micro_batch_costs(plan, costs, 2).tolist() == [3, 7, 5]
    assert micro_batch_costs(plan, costs, 4).tolist() == [10, 5]
    with pytest.raises(ValueError, match="rows_per_batch must be an integer >= 1"):
        micro_batch_costs(plan, costs, 0)


def test_empty_input():
    for strategy in CURRENT_STRATEGIES:
        plan = plan_packs([], 8, strategy=strategy, costs=[], max_cost=3)
        assert plan.num_rows == 0 and row_costs(plan, []).size == 0 and micro_batch_costs(plan, [], 2).size == 0


# ------------------------------------------------------------------ engines against the references

sizes_costs_st = st.lists(st.tuples(st.integers(1, 30), st.integers(0, 20)), max_size=40)
cap_st = st.integers(30, 60)
max_cost_st = st.integers(20, 60)
per_row_st = st.none() | st.integers(1, 5)


@FAST
@given(sizes_costs_st, cap_st, max_cost_st, per_row_st)
def test_engines_match_their_references_item_by_item(pairs, cap, max_cost, per_row):
    sizes, costs = [s for s, _ in pairs], [c for _, c in pairs]
    for strategy, ref in (
        ("next_fit", ref_next_fit_2d(sizes, costs, cap, max_cost, per_row)),
        ("best_fit_decreasing", ref_bfd_2d(sizes, costs, cap, max_cost, per_row)),
        ("histogram_best_fit", ref_bfd_2d(sizes, costs, cap, max_cost, per_row)),
    ):
        plan = plan_packs(sizes, cap, strategy=strategy, max_per_row=per_row, costs=costs, max_cost=max_cost)
        assert rows_of(plan) == ref, strategy
    for limit in (max_cost, None):
        plan = plan_packs(sizes, cap, strategy="wrapped", max_per_row=per_row, costs=costs, max_cost=limit)
        assert pieces_of(plan) == ref_wrapped_2d(sizes, costs, cap, limit, per_row)


@FAST
@given(sizes_costs_st, cap_st, per_row_st)
def test_a_cost_limit_that_never_binds_gives_textbook_rows(pairs, cap, per_row):
    sizes, costs = [s for s, _ in pairs], [c for _, c in pairs]
    loose = cap * max(costs + [1])  # a row of at most cap items can never reach it
    for strategy, ref in (
        ("next_fit", ref_next_fit(sizes, cap, per_row)),
        ("best_fit_decreasing", ref_best_fit_decreasing(sizes, cap, per_row)),
    ):
        plan = plan_packs(sizes, cap, strategy=strategy, max_per_row=per_row, costs=costs, max_cost=loose)
        assert rows_of(plan) == ref, strategy
    zero = [0] * len(sizes)
    plan = plan_packs(sizes, cap, strategy="wrapped", max_per_row=per_row, costs=zero, max_cost=1)
    assert pieces_of(plan) == ref_wrapped(sizes, cap, per_row)


# -------------------------------------------------------------------------------------- properties


@FAST
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(0, 40)), max_size=40),
    st.integers(1, 40),
    st.none() | st.integers(1, 40),
    st.sampled_from(CURRENT_STRATEGIES),
    st.sampled_from(OVERLONG_POLICIES),
    per_row_st,
    st.integers(0, 2),
)
def test_every_row_respects_both_limits(pairs, cap, max_cost, strategy, overlong, per_row, seed):
    lengths, costs = [s for s, _ in pairs], [c for _, c in pairs]
    kwargs = dict(strategy=strategy, overlong=overlong, max_per_row=per_row, seed=seed)
    over_cost = [i for i, c in enumerate(costs) if max_cost is not None and c > max_cost]
    long = [i for i, n in enumerate(lengths) if n > cap]
    cut_images = [i for i in long if costs[i] > 0 and overlong in ("truncate", "split")]
    if overlong != "drop" and (over_cost or cut_images or (long and overlong == "error")):
        with pytest.raises(ValueError, match="sequence"):
            plan_packs(lengths, cap, costs=costs, max_cost=max_cost, **kwargs)
        return
    plan = plan_packs(lengths, cap, costs=costs, max_cost=max_cost, **kwargs)
    check_costs(plan, lengths, costs, max_cost)  # tokens tiled once, rows within both limits, no image cut
    assert per_row is None or plan.stats.max_per_row <= per_row
    dropped = set(over_cost + long) if overlong == "drop" else set()
    assert set(plan.dropped.tolist()) == dropped
    assert plan.stats.dropped_tokens == sum(lengths[i] for i in dropped)
    assert set(plan.index.tolist()) == set(range(len(lengths))) - dropped
    whole = [i for i in plan.index.tolist() if costs[i] > 0]
    assert len(whole) == len(set(whole))  # a sequence with cost is one piece
    if strategy != "wrapped" and overlong != "split":
        assert sorted(plan.index.tolist()) == sorted(set(range(len(lengths))) - dropped)


@FAST
@given(
    st.lists(st.tuples(st.integers(1, 60), st.integers(0, 40)), max_size=40),
    st.integers(1, 40),
    st.sampled_from(CURRENT_STRATEGIES),
    st.sampled_from(OVERLONG_POLICIES[1:]),
    per_row_st,
    st.integers(0, 2),
)
def test_without_max_cost_the_plan_is_the_token_only_plan(pairs, cap, strategy, overlong, per_row, seed):
    lengths, costs = [s for s, _ in pairs], [c for _, c in pairs]
    kwargs = dict(strategy=strategy, overlong=overlong, max_per_row=per_row, seed=seed)
    plain = plan_packs(lengths, cap, **kwargs)
    cut = set(plain.index[plain.start > 0].tolist()) | set(plain.truncated.tolist())
    if any(costs[i] > 0 for i in cut):
        if strategy == "wrapped" and not any(costs[i] > 0 and lengths[i] > cap for i in cut):
            plan = plan_packs(lengths, cap, costs=costs, **kwargs)  # wrapped moves it instead
            check_costs(plan, lengths, costs, None)
        else:
            with pytest.raises(ValueError, match="would cut its images"):
                plan_packs(lengths, cap, costs=costs, **kwargs)
        return
    plan = plan_packs(lengths, cap, costs=costs, **kwargs)
    for name in ARRAYS:
        assert np.array_equal(getattr(plan, name), getattr(plain, name)), name
    assert plan.stats == plain.stats


def test_the_exact_share_falls_back_to_floats_without_overflow():
    sizes = np.array([3, 5, 2], dtype=np.int64)
    costs = np.array([0, 1 << 40, 1 << 41], dtype=np.int64)
    rows = costs_mod.best_fit_decreasing_2d(sizes, costs, 1 << 30, 1 << 42, None)  # cap * max_cost >= 2**62
    assert rows.item.tolist() == [2, 1, 0] and rows.row_offsets.tolist() == [0, 3]
