"""Behaviours of trajectories and what the policy-gradient update paid for (issue 52).

    register_behaviour   decorator: a user's environment adds its own behaviour function
    BEHAVIOURS           name -> Behaviour(name, fn, scope, shallow)
    behaviour_values     every behaviour over one step's trajectories
    step_results         one step's rows and per-behaviour stats (the trainer calls it)
    AlarmTracker         the shallow-strategy alarm, one step at a time
    StepBehaviours       the trainer's per-step rows, metrics and alarms
    run_job / main       ``agentrl behaviours --db PATH --run RUN_ID``

The formulas: measures.py (behaviours), payoff.py (Cov(A, b), its test, the alarm);
docs/behaviours.md for users.
"""
from storage.behaviours.job import (StepBehaviours, compute, main, records, run_job, stat_metrics,
                                    step_results)
from storage.behaviours.measures import (BEHAVIOURS, Behaviour, behaviour_values,
                                         query_pattern, register_behaviour)
from storage.behaviours.payoff import AlarmTracker, alarm_steps, covariance, step_stats

__all__ = ["AlarmTracker", "StepBehaviours", "BEHAVIOURS", "Behaviour", "alarm_steps", "behaviour_values", "compute",
           "covariance", "main", "query_pattern", "records", "register_behaviour", "run_job",
           "stat_metrics", "step_results", "step_stats"]
