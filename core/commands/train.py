"""Command line: ``python -m core.train --env search --model tiny --algo grpo --steps 10 ...``

Every TrainConfig field is a flag (``--group-size``, ``--max-new-tokens``, ...). Values are
layered, later wins: TrainConfig defaults < the algorithm's own defaults (core/algorithms/catalog.py,
applied by TrainConfig itself, so Python and the CLI train the same thing) < ``--preset NAME`` <
``--config FILE.yaml`` < flags given on the command line. ``--resume RUN_ID``
starts from the run's stored configuration instead, and only flags given override it (e.g. a
larger ``--steps`` to train further). The Train page starts ``--config FILE --db STORE --name
NAME``, FILE holding the form's whole configuration (pages/_jobs.py). The layers become one
TrainConfig, validated once.

Under ``torchrun --nproc_per_node N -m core.train ...`` the N processes train one run together
(core/learn/distributed.py): rank 0 resolves the configuration and hands it to the others, and is the
only one that opens the store.

Exit status: 0 when the run is recorded (finished, or stopped by Ctrl-C and resumable), 2 for a
bad configuration (the message names the field), 1 when training failed (the run is marked
'failed' with the error).
"""
from __future__ import annotations

import argparse
import ast
import inspect
import os
import sys
from dataclasses import fields
from pathlib import Path

import yaml

import core.config as config_module
from core.config import (ALGOS, ENDPOINT_PREFIX, ENVS, PRESETS, ConfigError, TrainConfig,
                         env_kwargs, validate)
from core.algorithms import REGISTRY
from core.envs import plugins
from core.run.lifecycle import record_and_exit
from storage import queries
from storage.db import StoreError
from storage.recorder import NullRecorder, Recorder

_FIELD_DOCS: dict[str, str] = {}
_BY_ALGO = {key for algo in REGISTRY.algorithms.values() for key in algo.defaults}


def _field_docs() -> dict[str, str]:
    """Each field's docstring (the line under it in core/config/train_config.py), for --help."""
    if not _FIELD_DOCS:
        tree = ast.parse(inspect.getsource(config_module.TrainConfig))
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)):
                _FIELD_DOCS[node.target.id] = str(nxt.value.value)
    return _FIELD_DOCS


def _yes_no(text: str) -> bool:
    """A boolean flag's value: true/false, yes/no, on/off or 1/0."""
    value = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m core.train", description="Train and record one agentic-RL run.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", metavar="FILE.yaml", help="YAML file of TrainConfig keys")
    parser.add_argument("--preset", metavar="NAME", help=f"one of {', '.join(PRESETS)}")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    docs = _field_docs()
    for f in fields(TrainConfig):
        typ = {"int": int, "float": float, "str": str, "bool": _yes_no}[
            f.type if isinstance(f.type, str) else f.type.__name__]
        flag = "--" + f.name.replace("_", "-")
        default = f"{f.default!r}" + (", or the algorithm's" if f.name in _BY_ALGO else "")
        choices = ALGOS if f.name == "algo" else None  # the registry's names: --algo {grpo,...}
        parser.add_argument(flag, dest=f.name, type=typ, choices=choices,
                            metavar=None if choices else f.name.upper(),
                            help=f"{docs.get(f.name, '')} (default {default})")
    return parser


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """Layer preset, config file and flags over the defaults (TrainConfig fills in the
    algorithm's own for what none of them set), build one TrainConfig from them and validate it:
    the process's one check, naming the bad key or field. ConfigError if bad."""
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    layers: dict = {}
    if getattr(args, "preset", None):
        if args.preset not in PRESETS:
            raise ConfigError(f"preset={args.preset!r}: must be one of {', '.join(PRESETS)}")
        layers.update(PRESETS[args.preset])
    if getattr(args, "config", None):
        layers.update(_file_keys(args.config))
    layers.update(given)
    if layers.get("resume"):
        layers = {**_stored_config(layers.get("db", TrainConfig.db), layers["resume"]), **layers}
    return checked_env(validate(TrainConfig.from_dict(layers)))


def checked_env(cfg: TrainConfig) -> TrainConfig:
    """A user's environment (``package.module:Factory`` or an installed plugin) is imported,
    built with the run's options and checked against the protocol here, so a broken one is
    refused with its name (exit 2) before the model loads. Built-in environments pass as is."""
    if cfg.env in ENVS:
        return cfg
    layers = [{}, *([{"sft": True}] if cfg.sft_env_options else []),
              *([{"eval": True}] if cfg.eval_env_options else [])]
    try:
        for layer in layers:
            env = plugins.build(cfg.env, **env_kwargs(cfg, **layer))
            plugins.check(env, cfg.env, need_expert=cfg.sft_steps > 0, seed=cfg.seed)
    except plugins.PluginError as exc:
        raise ConfigError(str(exc)) from exc
    return cfg


def _file_keys(path: str) -> dict:
    """Only the keys the config file sets (so it does not reset what a preset chose). Unknown
    keys and wrong types are refused with the other layers', by ``TrainConfig.from_dict``."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _stored_config(db_path: str, run_id: str) -> dict:
    """The configuration run ``run_id`` was started with, from its store."""
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
    # torch and the model stack (~1.7 s of imports) load only once the configuration is good:
    # a bad flag, file or plugin is refused at once, before any of it (exit 2)
    args = build_parser().parse_args(argv)
    ranks = None
    try:
        if _world() > 1:  # started by torchrun: rank 0 resolves, the others receive
            # deferred: torch.distributed, only under torchrun
            from core.learn.distributed import Ranks, check
            ranks = Ranks.from_env()
            cfg, error = _resolved_on_rank0(args, ranks, check)
        else:
            cfg, error = resolve_config(args), None
    except ConfigError as exc:
        cfg, error = None, str(exc)
    if error is None:
        error = _device_error(cfg, ranks)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        if ranks is not None:
            ranks.close()
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")      # before the hub's library reads them
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from core.learn.distributed import ONE
    from core.model.policy import ModelNotAvailable
    from core.run.collection import main as collect_main
    from core.run.trainer import train
    if cfg.model.startswith(ENDPOINT_PREFIX):  # a server as the policy: collects, never trains
        return collect_main(cfg, args, ranks)
    return record_and_exit(
        cfg.db, lambda: Recorder(cfg.db) if ranks is None or ranks.main else NullRecorder(),
        lambda recorder: train(cfg, recorder, progress=not getattr(args, "quiet", False),
                               ranks=ranks or ONE),
        "training", told=((ModelNotAvailable, ""),), announce=ranks is None or ranks.main,
        close=ranks.close if ranks is not None else lambda: None)


def _device_error(cfg: TrainConfig, ranks) -> str | None:
    """Why ``cfg.device`` cannot be had on this machine (e.g. cuda without a GPU), else None.
    Under torchrun every rank checks its own (cuda:LOCAL_RANK) and all learn of any failure, so
    they exit 2 together instead of waiting for one another."""
    from core.model.device import resolve   # torch: after the configuration's own checks
    try:
        resolve(cfg.device, ranks.local_rank if ranks else 0, ranks.world if ranks else 1)
        error = None
    except ConfigError as exc:
        error = str(exc)
    if ranks is not None and ranks.world > 1:
        errors, _ = ranks.everyone([error])
        error = next((f"rank {k}: {e}" for k, e in enumerate(errors) if e), None)
    return error


def _world() -> int:
    """WORLD_SIZE as torchrun sets it; 1 for a plain process."""
    value = os.environ.get("WORLD_SIZE", "1")
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"WORLD_SIZE={value!r} must be a positive whole number")
    return int(value)


def _resolved_on_rank0(args, ranks, check) -> tuple[TrainConfig | None, str | None]:
    """(config, None) on every rank, or (None, the error): rank 0 alone reads YAML and the store
    (for --resume), and checks that the batch splits into whole groups per rank."""
    cfg, error = None, None
    if ranks.main:
        try:
            cfg = resolve_config(args)
            check(cfg, ranks.world)
        except ConfigError as exc:
            error = str(exc)
    cfg_dict, error = ranks.broadcast((cfg.to_dict() if cfg else None, error))
    return (TrainConfig.from_dict(cfg_dict) if cfg_dict is not None else None), error
