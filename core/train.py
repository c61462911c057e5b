"""Command line: ``python -m core.train --env search --model tiny --algo grpo --steps 10 ...``

Every TrainConfig field is a flag (``--group-size``, ``--max-new-tokens``, ...). Values are
layered, later wins: TrainConfig defaults < the algorithm's own defaults (ALGO_DEFAULTS) <
``--preset NAME`` < ``--config FILE.yaml`` < flags given on the command line. ``--resume RUN_ID``
starts from the run's stored configuration instead, and only flags given override it (e.g. a
larger ``--steps`` to train further).

Exit status: 0 when the run is recorded (finished, or stopped by Ctrl-C and resumable), 2 for a
bad configuration (the message names the field), 1 when training failed (the run is marked
'failed' with the error).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from core.config import PRESETS, ConfigError, TrainConfig, validate

ALGO_DEFAULTS: dict[str, dict] = {
    # RAGEN's StarPO-S: clip-higher (eps_low 0.2, eps_high 0.28), no KL term.
    "starpo_s": {"clip_eps_high": 0.28, "kl_coef": 0.0},
}
"""Settings an algorithm is defined with, used unless a preset, the YAML file or a flag says
otherwise."""

_FIELD_DOCS: dict[str, str] = {}


def _field_docs() -> dict[str, str]:
    """Each field's docstring (the line under it in core/config.py), for --help."""
    if not _FIELD_DOCS:
        import ast
        import inspect
        import core.config as config_module
        tree = ast.parse(inspect.getsource(config_module.TrainConfig))
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)):
                _FIELD_DOCS[node.target.id] = str(nxt.value.value)
    return _FIELD_DOCS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m core.train", description="Train and record one agentic-RL run.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", metavar="FILE.yaml", help="YAML file of TrainConfig keys")
    parser.add_argument("--preset", metavar="NAME", help=f"one of {', '.join(PRESETS)}")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    docs = _field_docs()
    for f in fields(TrainConfig):
        typ = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str)
                                                        else f.type.__name__]
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, dest=f.name, type=typ, metavar=f.name.upper(),
                            help=f"{docs.get(f.name, '')} (default {f.default!r})")
    return parser


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """Layer defaults, algorithm defaults, preset, YAML and flags; validate. ConfigError if bad."""
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    layers: dict = {}
    if getattr(args, "preset", None):
        if args.preset not in PRESETS:
            raise ConfigError(f"preset={args.preset!r}: must be one of {', '.join(PRESETS)}")
        layers.update(PRESETS[args.preset])
    if getattr(args, "config", None):
        TrainConfig.from_yaml(args.config)  # refuses unknown keys and wrong types, naming them
        layers.update(_yaml_keys(args.config))
    layers.update(given)
    if layers.get("resume"):
        base = _stored_config(layers.get("db", TrainConfig.db), layers["resume"])
        base.update({k: v for k, v in layers.items()})
        return validate(TrainConfig.from_dict(base))
    algo = layers.get("algo", TrainConfig.algo)
    merged = {**ALGO_DEFAULTS.get(algo, {}), **layers}
    return validate(TrainConfig.from_dict(merged))


def _yaml_keys(path: str) -> dict:
    """Only the keys the YAML file sets (so it does not reset what a preset chose)."""
    import yaml
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    return {k.replace("-", "_"): v for k, v in data.items()}


def _stored_config(db_path: str, run_id: str) -> dict:
    """The configuration run ``run_id`` was started with, from its store."""
    from storage import queries
    from storage.db import StoreError
    if not os.path.exists(db_path):
        raise ConfigError(f"resume={run_id!r}: no database at db={db_path!r}")
    try:
        runs = queries.runs(db_path)
    except StoreError as exc:
        raise ConfigError(f"resume={run_id!r}: cannot read db={db_path!r}: {exc}") from exc
    row = runs[runs["run_id"] == run_id]
    if row.empty:
        raise ConfigError(f"resume={run_id!r}: no such run in {db_path}")
    config = queries.run_config(row.iloc[0]["config"])
    known = {f.name for f in fields(TrainConfig)}
    return {k: v for k, v in config.items() if k in known}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = resolve_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from core.policy import ModelNotAvailable
    from core.trainer import train
    from storage.recorder import Recorder
    from storage.db import StoreError
    try:
        recorder = Recorder(cfg.db)
    except StoreError as exc:  # a foreign, unreadable or newer store: refused, untouched
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run_id = train(cfg, recorder, progress=not getattr(args, "quiet", False))
    except ModelNotAvailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"error: training failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        recorder.close()
    print(f"run {run_id} recorded in {cfg.db}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
