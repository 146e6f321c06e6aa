"""mofa solve's pipeline-layout lines (render_layout) on hand-made reports."""

from mofa.commands.solve import render_layout

REPORT = {"optimal": False, "gap": 0.0111, "step_gap": 0.011, "search_time_s": 10.0, "space_size": 7.2e74, "applied": False,
          "step_time_s": 16.2062, "megatron_split_step_time_s": 16.2062, "gain": 0.0, "layout": "E|t|L",
          "regular": {"step_time_s": 16.2062, "optimal": True, "gap": 0.0, "step_gap": 0.0}}


def test_an_uncertified_free_search_says_what_its_regular_phase_proved():
    assert "among regular layouts (a rank's chunks within one layer): 16.2062 s, certified optimal there" in render_layout(REPORT)
    unproven = {**REPORT, "regular": {**REPORT["regular"], "optimal": False, "step_gap": 0.018}}
    assert "among regular layouts (a rank's chunks within one layer): 16.2062 s, step gap 1.80% there" in render_layout(unproven)


def test_a_certified_answer_or_no_regular_phase_adds_no_line():
    for report in ({**REPORT, "optimal": True, "gap": 0.0, "step_gap": 0.0}, {**REPORT, "regular": None}):
        assert "among regular layouts" not in render_layout(report)
