"""Restart backoff and the crash-loop rule, given the time: no trio, no clock."""

from __future__ import annotations

import pytest

from acp_bridge.agents.backoff import MAX_DEATHS, CrashLoop, Restarts
from acp_bridge.config.model import BridgeConfig


def rule(**overrides):
    limits = {"initial": 0.5, "maximum": 4.0, "limit": 5, "window": 60.0, **overrides}
    return Restarts(**limits)


def test_an_agent_that_never_died_starts_at_once():
    """No death: no wait."""
    assert rule().next_start(123.0) == 0.0


def test_each_recent_death_doubles_the_wait_up_to_the_cap():
    """initial, doubled per recent death, capped at maximum; at limit deaths, a crash loop."""
    restarts = rule(limit=6)
    waits = []
    for now in range(6):
        restarts.died(float(now))
        waits.append(restarts.next_start(float(now)))
    assert waits[:5] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert waits[5] == CrashLoop(deaths=6, window=60.0)


def test_deaths_older_than_the_window_are_forgotten():
    """The loop ends once the oldest death is window seconds old (deaths at exactly that age
    no longer count), and the wait shrinks with the deaths still in the window."""
    restarts = rule(limit=3, window=10.0)
    for now in (0.0, 1.0, 2.0):
        restarts.died(now)
    assert restarts.next_start(9.999) == CrashLoop(deaths=3, window=10.0)
    assert restarts.next_start(10.0) == 1.0  # two recent deaths: 0.5 * 2
    assert restarts.next_start(11.0) == 0.5
    assert restarts.next_start(12.0) == 0.0


def test_only_the_last_deaths_are_remembered():
    """At most MAX_DEATHS deaths are kept: a limit above it can never be reached."""
    restarts = rule(limit=MAX_DEATHS + 1, maximum=1e30)
    for _ in range(MAX_DEATHS * 2):
        restarts.died(0.0)
    assert restarts.next_start(0.0) == pytest.approx(0.5 * 2 ** (MAX_DEATHS - 1))


def test_the_rule_comes_from_the_bridge_table():
    """restart_backoff_initial/max and crash_loop_limit/window, as configured."""
    config = BridgeConfig(
        restart_backoff_initial=0.25,
        restart_backoff_max=1.0,
        crash_loop_limit=2,
        crash_loop_window=5.0,
    )
    restarts = Restarts.from_config(config)
    restarts.died(0.0)
    assert restarts.next_start(0.0) == 0.25
    restarts.died(1.0)
    assert restarts.next_start(1.0) == CrashLoop(deaths=2, window=5.0)


def test_what_a_death_not_yet_recorded_will_mean_is_told_without_recording_it():
    """``dying``: the verdict as if the agent died at ``now`` too (its exit is being told)."""
    restarts = Restarts.from_config(BridgeConfig(crash_loop_limit=2, crash_loop_window=5.0))
    assert restarts.next_start(0.0, dying=True) == 0.5
    restarts.died(0.0)
    assert restarts.next_start(1.0, dying=True) == CrashLoop(deaths=2, window=5.0)
    assert restarts.next_start(1.0) == 0.5  # (nothing was recorded)
