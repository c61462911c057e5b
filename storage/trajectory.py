"""The trajectory model: what a trajectory, a turn, a token, a test and a reward component are,
said once. Pure, standard library only (no torch, no storage module below it).

Every place that used to spell the schema out by hand derives from the field specs here:

* validation of the generic record (storage/interchange.py: ``kind`` and ``required``, in spec
  order, required fields first), and the token columns' checks (storage/token_columns.py);
* the store's rows: a field with an ``sql`` type is a column of the model's table, one without
  is carried by the record alone (``turns``, ``tokens``, ``rewards``... are rows of other
  tables); a field whose ``kind`` is None is the store's own (``run_id``, ``pos``...);
* the queries' column lists (storage/queries.py), the JSON columns the recorder serialises
  (storage/recorder.py ``JSON_COLUMNS``) and the fields export writes (storage/interchange.py
  ``from_rows``).

The store's tables are created by numbered migrations (storage/migrations.py), which stay for
old stores; tests/test_trajectory_model.py checks that a migrated store's columns of these
tables are the model's, so a field added here without a migration (or the reverse) fails.

Beside the fields: the token ``ROLES``, the four ``STANDARD_COMPONENTS`` of every reward, the
action protocol (``ACTION_TYPES``: what a turn's ``action_type`` says; which of them call a tool
and which finish reasons mean the policy ended the episode) and the failure taxonomy's classes
(``FAILURE_CLASSES``, in the order storage/failures.py tries its rules). The typed records
``Trajectory``, ``Turn``, ``Token``, ``Test`` and ``Reward`` are made from the specs, so they
cannot drift from them; the token rows themselves stay columnar (storage/token_columns.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple


class Field(NamedTuple):
    name: str
    kind: str | None
    """How validation reads it (storage/interchange.py ``_check``): id, str, int (0..2^31),
    sint (32-bit), num, lp (a log-probability), bool, dict, list, json; None: the store's own
    column, never in a record."""
    required: bool
    sql: str | None
    """Its column's type in the model's table; None: carried by the record only."""
    doc: str


def _f(name: str, kind: str | None, sql: str | None, doc: str, required: bool = False) -> Field:
    return Field(name, kind, required, sql, doc)


def _key(*names: str) -> tuple[Field, ...]:
    docs = {"run_id": "the run it belongs to", "step": "the training step it was rolled out at",
            "traj_id": "the trajectory's id, unique in its run"}
    return tuple(_f(n, None, "INTEGER" if n == "step" else "VARCHAR", docs[n]) for n in names)


TRAJECTORY = (
    _f("run_id", None, "VARCHAR", "the run it belongs to"),
    _f("step", "int", "INTEGER", "the training step (default 0)"),
    _f("traj_id", "id", "VARCHAR", "the trajectory's id, unique in its run", True),
    _f("group_id", "id", "VARCHAR", "its group (default '{step}:{task_id}')"),
    _f("task_id", "id", "VARCHAR", "the task it attempted", True),
    _f("turns", "list", None, "its turns (TURN), rows of the turns table", True),
    _f("split", "id", "VARCHAR", "train | eval | sft | expert | branch | ... (default train)"),
    _f("reward", "num", "DOUBLE", "the whole reward", True),
    _f("advantage", "num", "DOUBLE", "the trajectory's advantage"),
    _f("success", "bool", "BOOLEAN", "whether it solved the task"),
    _f("num_turns", None, "INTEGER", "how many turns it has"),
    _f("finish_reason", "str", "VARCHAR", "why it ended (answered, done, max_turns, error...)"),
    _f("failure_class", "str", "VARCHAR", "FAILURE_CLASSES, computed when recorded if not given"),
    _f("filtered", "bool", "BOOLEAN", "dropped from the update (StarPO-S, |A| small)"),
    _f("grad_norm", "num", "DOUBLE", "norm of its gradient increment"),
    _f("response_tokens", "int", "INTEGER", "tokens generated (default: trained tokens)"),
    _f("prompt", "str", "VARCHAR", "the task as the model was asked it"),
    _f("answer", "str", "VARCHAR", "the parsed final answer, if any"),
    _f("golds", "json", "JSON", "gold answers / expected result, if any"),
    _f("info", "dict", "JSON", "what the failure rules read besides the turns; import notes"),
    _f("rank", "int", "INTEGER", "the torchrun rank that rolled it out (default 0)"),
    _f("rewards", "dict", None, "named reward components (REWARD), rows of the rewards table"),
    _f("tokens", "list", None, "its context token by token (TOKEN), rows of the tokens table"),
    _f("run", "dict", None, "the run's configuration (runs.config), from the first record"),
    _f("tests", "list", None, "unit tests on the final state (TEST), rows of test_results"),
)
TURN = (
    *_key("run_id", "step", "traj_id"),
    _f("turn", None, "INTEGER", "the turn's index in its trajectory"),
    _f("action", "str", "VARCHAR", "what the policy said", True),
    _f("observation", "str", "VARCHAR", "what the environment answered (default '')"),
    _f("action_valid", "bool", "BOOLEAN", "whether the environment accepted the action"),
    _f("action_type", "str", "VARCHAR", "ACTION_TYPES"),
    _f("parsed", "json", "JSON", "the parsed action arguments (an imported call's tool_calls)"),
    _f("obs_truncated", "bool", "BOOLEAN", "the observation was cut"),
    _f("action_truncated", "bool", "BOOLEAN", "the action was cut by max new tokens"),
    _f("latency_s", "num", "DOUBLE", "seconds the turn took"),
    _f("error", "str", "VARCHAR", "the tool's or environment's error"),
    _f("state_diff", "json", "JSON", "rows a mutating action changed (apps)"),
    _f("advantage", "num", "DOUBLE", "turn-level advantage (GiGPO), else the trajectory's"),
    _f("step_reward", "num", "DOUBLE", "the reward of this turn alone"),
    _f("state_key", "str", "VARCHAR", "the environment's state key (GiGPO's anchor)"),
    _f("info", "dict", "JSON", "the step's info (slips, counters; a span's model and tokens)"),
)
TOKEN = (
    *_key("run_id", "step", "traj_id"),
    _f("pos", None, "INTEGER", "the token's position in the context"),
    _f("text", "str", "VARCHAR", "its text", True),
    _f("role", "str", "VARCHAR", "ROLES", True),
    _f("trained", "bool", "BOOLEAN", "in the loss (default: role is action)"),
    _f("logprob", "lp", "DOUBLE", "the sampler's log-probability"),
    _f("token_id", "int", "INTEGER", "the tokenizer's id"),
    _f("turn", "sint", "INTEGER", "turn index (-1 for the prompt)"),
    _f("advantage", "num", "DOUBLE", "the advantage the loss gave it"),
    _f("entropy", "num", "DOUBLE", "the sampling distribution's entropy at it"),
    _f("new_logprob", "lp", "DOUBLE", "the updated policy's logprob (last epoch)"),
    _f("ref_logprob", "lp", "DOUBLE", "the reference (adapter-disabled) logprob"),
    _f("value", "num", "DOUBLE", "value-head estimate (ppo)"),
    _f("train_logprob", "lp", "DOUBLE", "the trainer's own logprob under the sampling weights"),
    _f("rejected", "bool", "BOOLEAN", "taken out of the loss by rollout correction"),
)
TEST = (
    *_key("run_id", "step", "traj_id"),
    _f("name", "id", "VARCHAR", "the test's name", True),
    _f("passed", "bool", "BOOLEAN", "whether it passed", True),
    _f("detail", "str", "VARCHAR", "what it saw"),
)
REWARD = (
    *_key("run_id", "step", "traj_id"),
    _f("component", "id", "VARCHAR", "the component's name (STANDARD_COMPONENTS and others)"),
    _f("value", "num", "DOUBLE", "its value"),
)
TABLES: dict[str, tuple[Field, ...]] = {"trajectories": TRAJECTORY, "turns": TURN,
                                        "tokens": TOKEN, "test_results": TEST, "rewards": REWARD}
"""The store's tables of the model, by name."""

ROLES = ("prompt", "action", "observation")
"""A token's role; its index is the role's code in storage/token_columns.py."""
STANDARD_COMPONENTS = ("outcome", "format", "cost", "process")
"""Reward components every trajectory records (a missing one as 0.0)."""


class ActionType(NamedTuple):
    name: str
    tool: bool
    """Calls a tool: charged ``cost_per_tool_call`` (core/credit/rewards.py)."""
    doc: str


ACTION_TYPES = {a.name: a for a in (
    ActionType("search", True, "a <search> query (the search env)"),
    ActionType("answer", False, "the final answer: the policy ends the episode"),
    ActionType("tool", True, "a tool call (apps, an imported chat's calls)"),
    ActionType("code", True, "code run in the sandbox (apps)"),
    ActionType("docs", True, "a documentation lookup (apps)"),
    ActionType("api", True, "an API call (apps)"),
    ActionType("move", False, "a move in a grid world (sokoban, frozenlake)"),
    ActionType("pull", False, "a bandit's pull"),
    ActionType("invalid", False, "an action that did not parse"),
)}
"""What a turn's ``action_type`` says; other values are stored as given."""
TOOL_ACTIONS = frozenset(a.name for a in ACTION_TYPES.values() if a.tool)
PROPER_ENDINGS = frozenset({"answered", "done"})
"""Finish reasons that mean the policy ended the episode itself."""

FAILURE_CLASSES = (
    "collateral_damage", "success", "sample_error", "refused", "format_error", "invalid_action",
    "repeated_action_loop", "tool_error_unrecovered", "limit_exceeded", "no_answer",
    "unmet_state_test", "answered_without_search", "answered_without_tool_call",
    "wrong_answer_with_evidence", "wrong_answer_without_evidence", "wrong_answer", "unsolved")
"""The failure taxonomy's classes in the order its rules are tried (storage/failures.py)."""


# -- derived views ----------------------------------------------------------------------------
def record_fields(spec: tuple[Field, ...]) -> dict[str, tuple[str, bool]]:
    """{name: (kind, required)} of the fields a record gives, required ones first, each group
    in spec order: the order validation checks them in (the first bad one is named)."""
    given = [f for f in spec if f.kind is not None]
    return {f.name: (f.kind, f.required) for f in sorted(given, key=lambda f: not f.required)}


def columns(table: str) -> tuple[str, ...]:
    """The model's columns of ``table``, in spec order."""
    return tuple(f.name for f in TABLES[table] if f.sql is not None)


def json_columns(table: str) -> tuple[str, ...]:
    return tuple(f.name for f in TABLES[table] if f.sql == "JSON")


def store_only(table: str) -> tuple[str, ...]:
    """Columns the store fills, never a record (keys and counts)."""
    return tuple(f.name for f in TABLES[table] if f.kind is None)


def of_kind(spec: tuple[Field, ...], *kinds: str) -> tuple[str, ...]:
    """Names of ``spec``'s fields of ``kinds``, in validation order."""
    return tuple(n for n, (k, _) in record_fields(spec).items() if k in kinds)


def checked(table: str, *names: str) -> tuple[str, ...]:
    """``names``, each checked to be a column of the model's ``table``: a query or a writer
    that names a column the model lacks fails when its module loads, not when it runs."""
    known = columns(table)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"not columns of {table} in the trajectory model: {unknown}")
    return names


def select(table: str, *names: str) -> str:
    """``checked`` names as a SELECT list."""
    return ", ".join(checked(table, *names))


# -- typed records ----------------------------------------------------------------------------
def _typed(cls_name: str, spec: tuple[Field, ...], doc: str) -> type:
    fields = [(f.name, Any, dataclasses.field(default=None, metadata={"doc": f.doc}))
              for f in spec]
    cls = dataclasses.make_dataclass(cls_name, fields, frozen=True)
    cls.__module__, cls.__doc__ = __name__, doc
    return cls


Turn = _typed("Turn", TURN, "One turn of a trajectory (TURN's fields).")
Token = _typed("Token", TOKEN, "One token row (TOKEN's fields); a trajectory's tokens are held "
                               "as columns (storage/token_columns.py) or as these records.")
Test = _typed("Test", TEST, "One unit test on a trajectory's final state (TEST's fields).")
Reward = _typed("Reward", REWARD, "One reward component of a trajectory (REWARD's fields).")
Trajectory = _typed("Trajectory", TRAJECTORY, "One trajectory (TRAJECTORY's fields): from_record "
                                              "makes it of a validated generic record.")


def from_record(rec: dict) -> Any:
    """The typed Trajectory of a validated generic record (storage/interchange.py ``validate``):
    turns and tests as ``Turn`` / ``Test``, components as ``Reward``; token objects as
    ``Token``, token columns kept as they are (the import's fast path never builds records)."""
    key = {"step": rec.get("step", 0), "traj_id": rec["traj_id"]}
    known = {f.name for f in TRAJECTORY}
    fields = {k: v for k, v in rec.items() if k in known}
    fields["turns"] = tuple(Turn(**key, turn=i, **t) for i, t in enumerate(rec["turns"]))
    fields["tests"] = tuple(Test(**key, **t) for t in rec.get("tests", ()))
    fields["rewards"] = tuple(Reward(**key, component=c, value=v)
                              for c, v in (rec.get("rewards") or {}).items())
    tokens = rec.get("tokens")
    if isinstance(tokens, list):
        fields["tokens"] = tuple(Token(**key, pos=i, **t) for i, t in enumerate(tokens))
    fields["num_turns"] = len(fields["turns"])
    return Trajectory(**fields)


def row(record: Any) -> dict:
    """The store's row of a typed record: its columns (the record-only fields left out)."""
    spec = {Trajectory: TRAJECTORY, Turn: TURN, Token: TOKEN, Test: TEST, Reward: REWARD}[
        type(record)]
    return {f.name: getattr(record, f.name) for f in spec if f.sql is not None}
