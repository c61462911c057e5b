"""The generic trajectory format: one JSON object per line, any agent's trajectories.

A line (only ``traj_id``, ``task_id``, ``turns`` and ``reward`` are required)::

    {"traj_id": "q17-a", "task_id": "q17", "group_id": "q17@step3", "step": 3, "split": "train",
     "prompt": "Who wrote Dune?",
     "turns": [{"action": "<search>Dune author</search>",
                "observation": "<information>Doc 1(Title: Dune) ... Frank Herbert ...</information>",
                "action_valid": true, "action_type": "search"},
               {"action": "<answer>Frank Herbert</answer>", "observation": ""}],
     "reward": 1.0, "rewards": {"outcome": 1.0, "format": 0.0, "cost": 0.0, "process": 0.0},
     "advantage": 0.71, "success": true, "finish_reason": "answered",
     "answer": "Frank Herbert", "golds": ["Frank Herbert"],
     "tests": [{"name": "answer_matches", "passed": true, "detail": "answer 'Frank Herbert'"}],
     "tokens": [{"text": "Who", "role": "prompt"}, {"text": " wrote", "role": "prompt"}, ...,
                {"text": "<search>", "role": "action", "trained": true, "logprob": -0.12,
                 "token_id": 27, "turn": 0}, ...],
     "info": {"any": "JSON"}, "run": {"env": "search", "model": "...", "algo": "grpo"}}

Rules, so every page can show an imported run:

* ``rewards`` holds named components. ``outcome``, ``format``, ``cost`` and ``process`` are
  recorded for every trajectory: without ``rewards`` the whole ``reward`` is the outcome and the
  other three are 0.0; a listed-but-missing one of the four is recorded as 0.0. Either way the
  trajectory's ``info.import_notes`` says so. Other component names are recorded as they are.
* ``tokens`` is optional. Without it the context is rebuilt from the text — prompt, then each
  turn's action and observation — split into whitespace-led pieces (``" word"``), with role
  ``prompt``/``action``/``observation``, ``trained`` = (role is ``action``), ``token_id`` and
  ``logprob`` NULL. Concatenating ``text`` by ``pos`` gives the full context either way; the
  pieces are not the model's tokens, and pages that need logprobs say they are missing.
* ``group_id`` defaults to ``"{step}:{task_id}"`` (same task at the same step = one group);
  ``step`` to 0, ``split`` to ``train``, ``observation`` to ``""``.
* ``tests`` is optional: the unit tests run on the episode's final state (stateful envs such as
  apps), each ``{"name", "passed", "detail"}`` (``detail`` optional). They are stored as the
  trajectory's test results, which Replay shows, and the failure rules read them as
  ``info.tests`` unless ``info`` has its own, as they do the trainer's outcome tests.
* A turn's ``state_diff`` is the list of rows its action changed, each ``{"table", "op", "key",
  "before", "after"}`` as the apps env logs them; Replay shows it turn by turn. A turn's
  ``info`` (an object: the step's info, an OTLP span's model and token counts) and
  ``state_key`` are stored with it and exported back. Every field and its kind is the
  trajectory model's (storage/trajectory.py).
* ``info`` is what the failure rules read besides the turns (``collateral``, ``retrieved_gold``,
  ``tests``; storage/failures.py), so an agent that puts its env outcome's ``info`` there gets the
  class a trainer run of the same episode would get. A given ``failure_class`` is kept as it is.
* ``run`` (the run's configuration) is read from the first line that has it.
* Unknown top-level keys are kept under ``info.extra``.
* Text: a string may hold anything JSON can say; a lone UTF-16 surrogate (``"\\ud83d"``, half of
  an emoji cut in two) is stored as U+FFFD and NUL as U+2400 (storage/recorder.py's cleaning,
  which every import and the trainer share); only bytes that are not UTF-8 fail the line.
* Numbers: the literals NaN/Infinity are not JSON and are refused, as is any number a double
  cannot hold (``1e999`` anywhere, a 400-digit ``reward``): the line fails, naming the field. A
  numeric field may instead hold the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``: that is
  how export writes those numbers, so every file we export imports again. Integers inside JSON
  fields (``info``, ``golds``, ...) are kept exactly, however long.
* A token's ``rejected`` (optional, true/false) marks a generated token that rollout correction
  took out of the loss (``trained`` false); the mismatch figures read it (``TOKEN_FIELDS``).
* A token's log-probabilities (``logprob``, ``train_logprob``, ``ref_logprob``,
  ``new_logprob``) must be finite and <= 0: NaN, +-Infinity (as numbers or strings) and values
  above ``LOGPROB_SLACK`` fail the line, naming the token; one up to ``LOGPROB_SLACK`` above 0 (a
  float32 log-softmax of a near-certain token) is stored as 0.0. ``-Infinity`` is refused too:
  a sampler gives it only for a token it could not have sampled, and one such value made a
  step's mismatch metrics NaN. (core/endpoint/reply.py checks a server's logprobs the same way.)
* Sizes: at most ``MAX_TURNS`` turns and tests, ``MAX_TRAJECTORY_TOKENS`` given tokens,
  ``MAX_COMPONENTS`` reward components and ``MAX_RECORD_VALUES`` JSON values in all per line
  (else the line fails, naming the count); tokens rebuilt from text are capped per text and per
  trajectory, the cut recorded (storage/token_rows.py).
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable

from storage.json_lines import (MAX_LINE_BYTES, MAX_RECORD_VALUES, LineError,  # noqa: F401
                                guarded, parse_json, read_json_lines, refuse_many_values,
                                refuse_non_finite)
from storage.recorder import NON_FINITE, clean_json, clean_text
from storage.token_columns import TokenColumns
from storage.token_rows import MAX_TRAJECTORY_TOKENS, TokenRows, pieces
from storage.trajectory import (ROLES, STANDARD_COMPONENTS, TEST, TOKEN, TRAJECTORY, TURN,  # noqa: F401
                                json_columns, record_fields, store_only)

MAX_ID_CHARS = 256
MAX_TURNS = 10_000
MAX_COMPONENTS = 1_000
LOGPROB_SLACK = 1e-4
"""A float32 log-softmax of a near-certain token can print a hair above 0; this much is kept."""


# -- validation -----------------------------------------------------------------------------------
def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def number(value: Any, field: str) -> float:
    """``value`` as a finite float, else LineError naming ``field``: a boolean is not a number,
    an integer no double holds (10^400) is refused, never multiplied, and so are NaN and +-inf.
    Every door's number check (``num`` fields here; storage/ingest/door.py's formats)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LineError(f"field '{field}' must be a number, got {_type_name(value)}")
    try:
        out = float(value)
    except OverflowError:
        raise LineError(f"field '{field}' must be a number a double can hold, got an integer "
                        f"of {value.bit_length()} bits") from None
    if not math.isfinite(out):
        raise LineError(f"field '{field}' must be a finite number, got {out}")
    return out


def _check(value: Any, kind: str, where: str) -> Any:
    """``value`` if it is of ``kind``, else LineError naming the field."""
    if kind == "num":
        if isinstance(value, str) and value in NON_FINITE:
            return NON_FINITE[value]  # as export writes the numbers JSON has no literal for
        return number(value, where)
    if kind == "lp":
        return _logprob(value, where)
    ok = {
        "str": isinstance(value, str),
        "id": isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS,
        "int": isinstance(value, int) and not isinstance(value, bool),
        "sint": isinstance(value, int) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "dict": isinstance(value, dict),
        "list": isinstance(value, list),
        "json": True,
    }[kind]
    if not ok:
        wanted = {"id": f"a non-empty string of at most {MAX_ID_CHARS} characters",
                  "str": "a string", "int": "an integer", "sint": "an integer", "bool": "true/false",
                  "dict": "an object", "list": "a list"}[kind]
        raise LineError(f"field '{where}' must be {wanted}, got {_type_name(value)}")
    if kind == "int" and not 0 <= value < 2**31:
        raise LineError(f"field '{where}' must be between 0 and 2^31-1, got {value}")
    if kind == "sint" and not -2**31 <= value < 2**31:
        raise LineError(f"field '{where}' must be a 32-bit integer, got {value}")
    return value


def _logprob(value: Any, where: str) -> float:
    """``value`` as a log-probability (finite, <= 0; up to LOGPROB_SLACK above 0 read as 0.0),
    else LineError naming the field and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
            isinstance(value, str) and value not in NON_FINITE):
        raise LineError(f"field '{where}' must be a number, got {_type_name(value)}")
    try:
        number = NON_FINITE[value] if isinstance(value, str) else float(value)
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    if not math.isfinite(number) or number > LOGPROB_SLACK:
        shown = value if isinstance(value, str) else repr(number)
        raise LineError(f"field '{where}' must be a log-probability (finite and <= 0), got "
                        f"{shown}")
    return min(number, 0.0)


# field -> (kind, required), from the trajectory model (storage/trajectory.py), required fields
# first; a None value of an optional field means "absent"
TOP_FIELDS = record_fields(TRAJECTORY)
TURN_FIELDS = record_fields(TURN)
TEST_FIELDS = record_fields(TEST)
TOKEN_FIELDS = record_fields(TOKEN)
_TRAJ_JSON, _TURN_JSON = json_columns("trajectories"), json_columns("turns")
"""``logprob`` is the sampler's; ``train_logprob`` the trainer's own under the same weights (the
training-inference mismatch, core/learn/mismatch.py, is their difference). ``rejected``
(``--rollout-correction mis|rs``) enters the mismatch figures (storage/mismatch_queries.py)."""


_TOKEN_KINDS = {name: kind for name, (kind, _) in TOKEN_FIELDS.items()}
_INF = float("inf")


def _token(tok: Any) -> dict | None:
    """``_fields(tok, TOKEN_FIELDS)`` for a token whose every value is plainly valid (exact
    types, finite, logprobs <= 0), else None: ``_fields`` then checks it and names what is
    wrong. The trainers' token-level rollouts give 10^5-10^6 tokens a run, and the general check
    cost two thirds of their import (bench/rl_import.py)."""
    if type(tok) is not dict or type(tok.get("text")) is not str \
            or type(tok.get("role")) is not str:
        return None
    out = {}
    for name, value in tok.items():
        kind = _TOKEN_KINDS.get(name)
        if kind is None or value is None:
            continue  # unknown keys are dropped, a None is absent: as _fields does
        vt = type(value)
        if kind == "lp" or kind == "num":
            if vt is int and -2**53 < value < 2**53:
                value = float(value)
            elif vt is not float or not -_INF < value < _INF:
                return None
            if kind == "lp" and value > 0.0:
                return None
        elif kind == "int" or kind == "sint":
            if vt is not int or not (0 if kind == "int" else -2**31) <= value < 2**31:
                return None
        elif vt is not (bool if kind == "bool" else str):
            return None
        out[name] = value
    return out


_TURN_KINDS = {name: kind for name, (kind, _) in TURN_FIELDS.items()}


def _turn(turn: Any) -> dict | None:
    """``_fields(turn, TURN_FIELDS)`` for a turn whose every value is plainly valid, else None
    (``_fields`` then names what is wrong): a trainer's multi-turn rollout gives a turn every
    few tokens, and the general check was a third of its import (bench/rl_import.py)."""
    if type(turn) is not dict or type(turn.get("action")) is not str:
        return None
    out = {}
    for name, value in turn.items():
        kind = _TURN_KINDS.get(name)
        if kind is None or value is None:
            continue
        vt = type(value)
        if kind == "num":
            if vt is int and -2**53 < value < 2**53:
                value = float(value)
            elif vt is not float or not -_INF < value < _INF:
                return None
        elif kind == "dict":
            if vt is not dict:
                return None
        elif kind != "json" and vt is not (bool if kind == "bool" else str):
            return None
        out[name] = value
    return out


def _info_text_read(turn: Any) -> Any:
    """``turn`` with an ``info`` given as the JSON text of an object read as that object: what
    export wrote before a turn's info was a field of the record (its stored JSON, as text), so
    that such a file still imports whole. Any other value is left for the check to name."""
    info = turn.get("info") if isinstance(turn, dict) else None
    if isinstance(info, str):
        value = parse_json(info.encode("utf-8", "surrogatepass"))  # NaN refused, as in a line
        if isinstance(value, dict):
            return dict(turn, info=value)
    return turn


def _fields(obj: Any, spec: dict, where: str, keep_extra: bool) -> dict:
    if not isinstance(obj, dict):
        raise LineError(f"{where or 'line'} must be a JSON object, got {_type_name(obj)}")
    out = {}
    for name, (kind, required) in spec.items():
        value = obj.get(name)
        if value is None:
            if required:
                raise LineError(f"missing field '{where}{name}'")
            continue
        out[name] = _check(value, kind, where + name)
    if keep_extra:
        extra = {k: v for k, v in obj.items() if k not in spec}
        if extra:
            out["extra"] = extra
    return out


RUN_SAID = {"model": ("model", "model_name", "model_path"),
            "env": ("env", "env_name", "environment", "data_source"),
            "algo": ("algo", "algorithm", "adv_estimator")}
"""Fields of another tool's record that name its run's model, environment and algorithm (an
OpenAI request's ``model``, verl's ``data_source`` and ``adv_estimator``)."""
RUN_SAID_CHARS = 200


def run_said(obj: Any) -> dict[str, str]:
    """{env, model, algo: the first non-empty string field of ``obj`` that names it
    (``RUN_SAID``)}, each cut to RUN_SAID_CHARS; what the record does not say is left out (the
    import fills in "unknown")."""
    said = {}
    if isinstance(obj, dict):
        for what, keys in RUN_SAID.items():
            value = next((obj[k] for k in keys if isinstance(obj.get(k), str) and obj[k].strip()),
                         None)
            if value is not None:
                said[what] = value.strip()[:RUN_SAID_CHARS]
    return said


def validate(obj: Any) -> dict:
    """A normalised trajectory record, or LineError saying which field is wrong and how. A
    trainer's ``tokens`` given as ``TokenColumns`` (storage/token_columns.py) are checked as
    columns, under the same rules and messages as tokens given as objects."""
    columns = obj.get("tokens") if isinstance(obj, dict) else None
    if not isinstance(columns, TokenColumns):
        return _validated(obj)
    rec = _validated({k: v for k, v in obj.items() if k != "tokens"})
    problem = columns.check(MAX_TRAJECTORY_TOKENS, LOGPROB_SLACK)
    if problem:
        raise LineError(problem)
    rec["tokens"] = columns
    return rec


def _validated(obj: Any) -> dict:
    refuse_many_values(obj)
    refuse_non_finite(obj)
    rec = _fields(obj, TOP_FIELDS, "", keep_extra=True)
    for name, limit in (("turns", MAX_TURNS), ("tokens", MAX_TRAJECTORY_TOKENS),
                        ("tests", MAX_TURNS), ("rewards", MAX_COMPONENTS)):
        if len(rec.get(name, ())) > limit:
            raise LineError(f"field '{name}' holds {len(rec[name])} entries, over the limit of "
                            f"{limit} per trajectory")
    rec["turns"] = [_turn(t) or _fields(_info_text_read(t), TURN_FIELDS, f"turns[{i}].",
                                        False) for i, t in enumerate(rec["turns"])]
    if "tokens" in rec:
        rec["tokens"] = [_token(t) or _fields(t, TOKEN_FIELDS, f"tokens[{i}].", False)
                         for i, t in enumerate(rec["tokens"])]
        for i, tok in enumerate(rec["tokens"]):
            if tok["role"] not in ROLES:
                raise LineError(f"field 'tokens[{i}].role' must be one of {ROLES}, "
                                f"got {tok['role']!r}")
    if "tests" in rec:
        rec["tests"] = [_fields(t, TEST_FIELDS, f"tests[{i}].", False)
                        for i, t in enumerate(rec["tests"])]
    for name, value in rec.get("rewards", {}).items():
        _check(name, "id", "rewards (a component name)")
        rec["rewards"][name] = _check(value, "num", f"rewards.{name}")
    return rec


# -- to table rows ------------------------------------------------------------------------------------
def reward_components(rec: dict, notes: list[str]) -> dict[str, float]:
    given = rec.get("rewards")
    if not given:
        notes.append("no reward components given: outcome = reward, format = cost = process = 0")
        return {"outcome": rec["reward"], "format": 0.0, "cost": 0.0, "process": 0.0}
    out = dict(given)
    missing = [c for c in STANDARD_COMPONENTS if c not in out]
    if missing:
        notes.append(f"missing reward components recorded as 0.0: {', '.join(missing)}")
        out.update({c: 0.0 for c in missing})
    return out


def _texts(rec: dict) -> list[tuple[str, str, int]]:
    """(text, role, turn) of the context in order: the prompt, then each turn's action and
    observation."""
    texts = [(rec.get("prompt") or "", "prompt", -1)]
    for i, turn in enumerate(rec["turns"]):
        texts += [(turn["action"], "action", i), (turn.get("observation") or "", "observation", i)]
    return texts


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(clean_json(value), ensure_ascii=False)


def to_rows(rec: dict, classify: Callable | None = None) -> dict[str, Any]:
    """Rows for trajectories, rewards, turns, tokens and test_results (without run_id) of one
    valid record: lists of dicts, but ``tokens``, a ``TokenRows`` (storage/token_rows.py) that
    makes its rows as they are written."""
    step, tid = rec.get("step", 0), clean_text(rec["traj_id"])  # a query parameter below: as
                                                                # it is stored (lone surrogates)
    notes: list[str] = []
    info = dict(rec.get("info") or {})
    if rec.get("extra"):
        info["extra"] = rec["extra"]
    components = reward_components(rec, notes)
    advantage = rec.get("advantage")
    if isinstance(rec.get("tokens"), TokenColumns):
        token_rows = TokenRows(tid, step, columns=rec["tokens"])
    elif "tokens" in rec:  # given tokens carry their own advantages, or none
        token_rows = TokenRows(tid, step, given=rec["tokens"])
    else:
        token_rows = TokenRows.rebuilt(tid, step, _texts(rec), advantage)
        notes.append("tokens rebuilt from text (whitespace pieces; no token ids or logprobs)")
        if token_rows.cuts:
            info["token_rows_cut"] = token_rows.cuts[:100]
            notes.append(f"token rows capped in {len(token_rows.cuts)} text(s): each one's last "
                         "row holds the rest of its text whole (storage/token_rows.py)")
    turns = [{"traj_id": tid, "step": step, "turn": i, "observation": "", **t}
             for i, t in enumerate(rec["turns"])]
    for t in turns:
        for name in _TURN_JSON:
            t[name] = _json(t.get(name))
    tests = [{"traj_id": tid, "step": step, "name": t["name"], "passed": t["passed"],
              "detail": t.get("detail")} for t in rec.get("tests", [])]
    failure_class = rec.get("failure_class")
    if failure_class is None and classify is not None:
        # as core.credit.scoring.classify_trajectory does: the outcome's tests, unless info has its own
        graded = dict(info)
        if tests:
            graded.setdefault("tests", [{"name": t["name"], "passed": t["passed"]} for t in tests])
        failure_class = _classify(classify, rec, turns, graded, notes)
    if notes:
        info["import_notes"] = list(info.get("import_notes", [])) + [
            n for n in notes if n not in info.get("import_notes", [])]
    traj = {"traj_id": tid, "step": step, "group_id": rec.get("group_id", f"{step}:{rec['task_id']}"),
            "task_id": rec["task_id"], "reward": rec["reward"], "advantage": advantage,
            "success": rec.get("success"), "num_turns": len(turns),
            "finish_reason": rec.get("finish_reason"), "split": rec.get("split", "train"),
            "rank": rec.get("rank", 0), "prompt": rec.get("prompt"), "answer": rec.get("answer"),
            "golds": _json(rec.get("golds")), "failure_class": failure_class,
            "filtered": rec.get("filtered", False), "grad_norm": rec.get("grad_norm"),
            "response_tokens": rec.get("response_tokens", token_rows.trained()),
            "info": _json(info or None)}
    rewards = [{"traj_id": tid, "step": step, "component": c, "value": v}
               for c, v in components.items()]
    return {"trajectories": [traj], "rewards": rewards, "turns": turns, "tokens": token_rows,
            "test_results": tests}


def _classify(classify: Callable, rec: dict, turns: list[dict], info: dict, notes: list[str]):
    try:
        return classify(turns, success=rec.get("success"), finish_reason=rec.get("finish_reason"),
                        answer=rec.get("answer"), info=info)
    except Exception as exc:  # a rule tripping on foreign data must not lose the trajectory
        notes.append(f"failure classification failed: {type(exc).__name__}: {exc}")
        return None


# -- from table rows (export) ---------------------------------------------------------------------------
TRAJ_OPTIONAL = tuple(n for n, (_, required) in TOP_FIELDS.items()
                      if not required and n in {f.name for f in TRAJECTORY if f.sql})
"""The stored fields a record may give (storage/trajectory.py): what export writes besides the
required ones."""


def _loads(row: dict, names: tuple[str, ...]) -> dict:
    """``row`` with its JSON columns ``names`` read back (a NULL or empty one left None)."""
    return dict(row, **{n: json.loads(row[n]) if row.get(n) else None for n in names})


def _clean(row: dict, drop: tuple[str, ...]) -> dict:
    return {key: value for key, value in row.items() if key not in drop and value is not None}


def from_rows(traj: dict, turns: list[dict], rewards: list[dict], tokens: list[dict],
              tests: list[dict] | None = None) -> dict:
    """The generic record of one stored trajectory (the inverse of ``to_rows``)."""
    rec = {"traj_id": traj["traj_id"], "task_id": traj["task_id"]}
    traj = {k: json.loads(v) if k in _TRAJ_JSON and v is not None else v
            for k, v in traj.items()}
    for key in TRAJ_OPTIONAL:
        rec[key] = traj.get(key)
    rec["turns"] = [_clean(_loads(t, _TURN_JSON), store_only("turns")) for t in turns]
    rec["reward"] = traj["reward"]
    rec["rewards"] = {r["component"]: r["value"] for r in rewards}
    rec["tokens"] = [_clean(t, store_only("tokens")) for t in tokens]
    if tests:
        rec["tests"] = [_clean(t, store_only("test_results")) for t in tests]
    # NaN/+-inf (DOUBLE columns; JSON written before the recorder wrote them as strings) become
    # "NaN"/"Infinity"/"-Infinity", which the importer reads back as those numbers.
    return clean_json(_clean(rec, ()))
