"""Pipeline schedules as data: every operation once, dependencies kept, the bubble and the
microbatches in flight as the chapter states them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_guide.core.checks import InputError, InputTypeError
from spmd_guide.core.drawing import show_figure
from spmd_guide.pipeline import schedules

sizes = st.tuples(st.sampled_from(schedules.SCHEDULES), st.integers(1, 8), st.integers(1, 12))


@settings(max_examples=15, deadline=None)
@given(sizes)
def test_every_operation_once_and_in_dependency_order(case):
    name, n_stages, n_micro = case
    plan = schedules.build_schedule(name, n_stages, n_micro)
    for kind in (schedules.FORWARD, schedules.BACKWARD):
        for s in range(n_stages):
            done = sorted(plan.micro[plan.kind[:, s] == kind, s].tolist())
            assert done == list(range(n_micro))  # each microbatch once, per stage and kind
    for m in range(n_micro):
        for s in range(n_stages):
            f, b = plan.step_of(schedules.FORWARD, m, s), plan.step_of(schedules.BACKWARD, m, s)
            if s:
                assert f > plan.step_of(schedules.FORWARD, m, s - 1)
            if s < n_stages - 1:
                assert b > plan.step_of(schedules.BACKWARD, m, s + 1)
            assert b > f


@settings(max_examples=15, deadline=None)
@given(sizes)
def test_bubble_is_the_closed_form_and_counts_idle_slots(case):
    name, n_stages, n_micro = case
    plan = schedules.build_schedule(name, n_stages, n_micro)
    closed = schedules.closed_form_bubble(n_stages, n_micro)
    assert plan.n_steps == 2 * (n_micro + n_stages - 1)
    assert plan.idle_slots == 2 * n_stages * (n_stages - 1)
    assert plan.idle_slots == round(closed * plan.n_steps * n_stages)
    assert schedules.bubble_fraction(name, n_stages, n_micro) == pytest.approx(closed, abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 8), st.integers(1, 12))
def test_in_flight_gpipe_holds_all_1f1b_at_most_the_stages(n_stages, n_micro):
    gpipe = schedules.build_schedule("gpipe", n_stages, n_micro).peak_in_flight()
    one_f_one_b = schedules.build_schedule("1f1b", n_stages, n_micro).peak_in_flight()
    assert list(gpipe) == [n_micro] * n_stages
    assert one_f_one_b.max() == min(n_stages, n_micro)
    for s, held in enumerate(one_f_one_b):  # stage s: S - s, one more while an input waits
        assert held <= min(n_stages - s + 1, n_micro)


@settings(max_examples=8, deadline=None)
@given(sizes)
def test_slots_of_microbatches_in_flight_never_collide(case):
    name, n_stages, n_micro = case
    plan = schedules.build_schedule(name, n_stages, n_micro)
    held = np.zeros((plan.n_steps, n_stages, n_micro), bool)
    for s in range(n_stages):
        for m in range(n_micro):
            start = (plan.step_of(schedules.FORWARD, m, s - 1) + 1 if s
                     else plan.step_of(schedules.FORWARD, m, 0))
            held[start:plan.step_of(schedules.BACKWARD, m, s) + 1, s, m] = True
    np.testing.assert_array_equal(held.sum(-1), plan.in_flight())
    n_slots = plan.n_slots
    for t in range(plan.n_steps):
        for s in range(n_stages):
            slots = [m % n_slots for m in np.nonzero(held[t, s])[0]]
            assert len(slots) == len(set(slots))


def test_tables_say_where_received_values_go():
    plan = schedules.build_schedule("1f1b", 3, 4)
    tables = plan.tables()
    t = plan.step_of(schedules.FORWARD, 2, 0)
    assert tables["recv_f"][t, 1] == 2 % plan.n_slots and tables["recv_f"][t, 0] == -1
    t = plan.step_of(schedules.BACKWARD, 1, 2)
    assert tables["recv_b"][t, 1] == 1 % plan.n_slots and tables["recv_b"][t, 2] == -1
    assert set(tables) == {"kind", "micro", "slot", "recv_f", "recv_b"}


def test_rows_and_drawing():
    plan = schedules.build_schedule("gpipe", 2, 2)
    assert [r["0"] for r in plan.rows()] == ["F0", "."]
    fig = schedules.draw_schedule(plan)
    assert len(fig.axes[0].patches) == plan.n_steps * plan.n_stages


_PLAN = schedules.build_schedule("gpipe", 2, 3)


@pytest.mark.parametrize(("call", "error", "word"), [
    (lambda: schedules.build_schedule("zigzag", 4, 4), InputError, "schedule"),
    (lambda: schedules.build_schedule("gpipe", 0, 4), InputError, "n_stages"),
    (lambda: schedules.build_schedule("gpipe", 4, 0), InputError, "n_microbatches"),
    (lambda: schedules.build_schedule("gpipe", 4, -3), InputError, "at least 1"),
    (lambda: schedules.build_schedule("gpipe", 4, float("nan")), InputTypeError, "integer"),
    (lambda: schedules.build_schedule("gpipe", "4", 4), InputTypeError, "n_stages"),
    (lambda: schedules.bubble_fraction("1f1b", 4, 2.5), InputTypeError, "integer"),
    (lambda: schedules.bubble_fraction(None, 4, 2), InputError, "schedule"),
    (lambda: schedules.closed_form_bubble(True, 4), InputTypeError, "n_stages"),
    (lambda: schedules.closed_form_bubble(4, 0), InputError, "n_microbatches"),
    (lambda: schedules.one_f_one_b_peak(0, 4), InputError, "n_stages"),
    (lambda: schedules.in_flight_rows(4, "8"), InputTypeError, "n_microbatches"),
    (lambda: schedules.bubble_rows(4, "12"), InputTypeError, "microbatches"),
    (lambda: schedules.bubble_rows(4, [1, 0]), InputError, r"microbatches\[1\]"),
    (lambda: schedules.bubble_rows(0, [1]), InputError, "n_stages"),
    (lambda: schedules.plot_bubble(2), InputTypeError, "stage_counts"),
    (lambda: schedules.plot_bubble([2], max_microbatches=0), InputError, "max_microbatches"),
    (lambda: schedules.plot_bubble([100]), InputError, "at most 64"),
    (lambda: schedules.draw_schedule("gpipe"), InputTypeError, "Schedule"),
    (lambda: schedules.draw_schedule(_PLAN, title=3), InputTypeError, "title"),
    (lambda: schedules.idle_rows(None), InputTypeError, "Schedule"),
    (lambda: _PLAN.step_of(schedules.IDLE, 0, 0), InputError, "kind"),
    (lambda: _PLAN.step_of(schedules.FORWARD, 3, 0), InputError, "m must be at most 2"),
    (lambda: _PLAN.step_of(schedules.FORWARD, 0, -1), InputError, "s must be at least 0"),
    (lambda: schedules.microbatches_for_bubble(4, 0.0), InputError, "positive"),
    (lambda: schedules.microbatches_for_bubble(4, 1.0), InputError, "below 1"),
    (lambda: schedules.microbatches_for_bubble(4, float("nan")), InputError, "finite"),
    (lambda: schedules.microbatches_for_bubble(4, 0.1, relative_to="busy"), InputError,
     "relative_to"),
])
def test_bad_input(call, error, word):
    with pytest.raises(error, match=word):
        call()


def test_numpy_scalars_work_like_python_ints():
    plan = schedules.build_schedule("1f1b", np.int64(4), np.int32(6))
    assert (plan.n_stages, plan.n_microbatches) == (4, 6)
    assert isinstance(plan.n_stages, int)
    assert schedules.bubble_fraction("gpipe", np.int64(4), np.int64(8)) == pytest.approx(3 / 11)
    assert schedules.closed_form_bubble(np.int16(4), np.uint8(8)) == pytest.approx(3 / 11)
    assert plan.step_of(np.int64(schedules.FORWARD), np.int64(0), np.int64(0)) == 0
    assert schedules.bubble_rows(np.int64(2), np.array([1, 2]))[1]["M"] == 2
    assert schedules.microbatches_for_bubble(np.int64(8), np.float32(0.5)) == 7


def test_bubble_rows_agree_with_closed_form():
    rows = schedules.bubble_rows(4, [1, 3, 8])
    assert [r["steps"] for r in rows] == [8, 12, 22]
    assert all(r["bubble (counted)"] == r["(S-1)/(M+S-1)"] for r in rows)
    assert len(schedules.plot_bubble([2], max_microbatches=3).axes) == 1


def test_chapter_exercises():
    # 1: eight stages need 63 microbatches for a bubble of at most 10 %
    assert schedules.bubble_fraction("gpipe", 8, 63) == pytest.approx(0.1)
    assert schedules.bubble_fraction("gpipe", 8, 62) > 0.1
    # 2: with M <= S, 1F1B holds every microbatch, like GPipe
    assert schedules.build_schedule("1f1b", 4, 2).peak_in_flight().max() == 2
    assert schedules.build_schedule("gpipe", 4, 2).peak_in_flight().max() == 2


@pytest.mark.parametrize(("n_stages", "bubble", "total", "ideal"), [
    (4, 0.1, 27, 30), (8, 0.1, 63, 70), (1, 0.5, 1, 1), (2, 0.5, 1, 2), (4, 0.3, 7, 10)])
def test_microbatches_for_a_bubble_in_both_conventions(n_stages, bubble, total, ideal):
    """pipeline.md: 10 % of the total time takes M >= 9 (S - 1); 10 % of the ideal time (the
    Megatron-LM paper's (p - 1) / m) takes M >= 10 (S - 1)."""
    got = {r: schedules.microbatches_for_bubble(n_stages, bubble, relative_to=r)
           for r in ("total", "ideal")}
    assert got == {"total": total, "ideal": ideal}
    m = got["total"]  # the fewest: the counted bubble meets the target there, not below
    assert schedules.bubble_fraction("gpipe", n_stages, m) <= bubble + 1e-12
    if m > 1:
        assert schedules.bubble_fraction("gpipe", n_stages, m - 1) > bubble
    m = got["ideal"]
    assert (n_stages - 1) / m <= bubble + 1e-12
    assert m == 1 or (n_stages - 1) / (m - 1) > bubble


def test_in_flight_rows_match_the_chapter():
    assert schedules.in_flight_rows(4, 8) == [
        {"stage": 0, "gpipe": 8, "1f1b": 4, "1f1b rule": 4},
        {"stage": 1, "gpipe": 8, "1f1b": 4, "1f1b rule": 4},
        {"stage": 2, "gpipe": 8, "1f1b": 3, "1f1b rule": 3},
        {"stage": 3, "gpipe": 8, "1f1b": 2, "1f1b rule": 2}]


def test_one_f_one_b_rule_equals_the_counted_peaks():
    """pipeline.md: stage 0 holds min(M, S), stage s > 0 min(M, S - s + 1)."""
    for n_stages in range(1, 9):
        for n_micro in range(1, 3 * n_stages + 1):
            counted = schedules.build_schedule("1f1b", n_stages, n_micro).peak_in_flight()
            assert list(counted) == schedules.one_f_one_b_peak(n_stages, n_micro)


def test_gpipe_idles_before_between_and_after():
    """pipeline.md: stage s idles s steps first, 2 (S - 1 - s) in the middle, s at the end."""
    for n_stages, n_micro in ((4, 6), (3, 2), (8, 9), (2, 1)):
        rows = schedules.idle_rows(schedules.build_schedule("gpipe", n_stages, n_micro))
        assert rows == [{"stage": s, "idle before": s, "idle between": 2 * (n_stages - 1 - s),
                         "idle after": s, "idle in all": 2 * (n_stages - 1)}
                        for s in range(n_stages)]


@pytest.mark.parametrize("name", schedules.SCHEDULES)
def test_chapter_exercise_on_messages(name):
    # 3: two ppermutes per step, 2 (M + S - 1) steps; (S - 1) M useful messages each way
    plan = schedules.build_schedule(name, 4, 8)
    tables = plan.tables()
    assert 2 * plan.n_steps == 44
    assert int((tables["recv_f"] >= 0).sum()) == int((tables["recv_b"] >= 0).sum()) == 24
    # each run sends S - 1 messages (pairs s -> s + 1, or s + 1 -> s): 44 x 3
    assert 2 * plan.n_steps * (plan.n_stages - 1) == 132


def test_schedule_figure_shows_as_svg_with_its_alt_text():
    fig = schedules.draw_schedule(schedules.build_schedule("1f1b", 2, 3))
    shown = show_figure(fig, alt='a "grid"')._repr_html_()
    assert "image/svg+xml" in shown and "alt='a &quot;grid&quot;'" in shown


def test_draw_schedule_refuses_what_is_not_an_axes():
    schedule = schedules.build_schedule("gpipe", 2, 2)
    with pytest.raises(InputTypeError, match="ax must be a matplotlib Axes"):
        schedules.draw_schedule(schedule, ax="left")


def test_a_schedule_with_tables_of_the_wrong_shape_is_refused():
    bad = schedules.Schedule("gpipe", 2, 2, np.zeros((3, 3), int), np.zeros((3, 3), int))
    with pytest.raises(InputError, match="n_stages=2"):
        schedules.idle_rows(bad)
