"""Makes real Inspect AI logs for tests/test_import_inspect.py. Run as a script, in a process of
its own (Inspect's eval sets up its own event loop, logging and environment):

    python tests/inspect_logs.py OUT_DIR

With Inspect's offline ``mockllm`` model, whose outputs a function here chooses, and real tools:
* ``OUT_DIR/eval/``: task ``arith`` as a ``.eval`` log; ``OUT_DIR/json/``: the same as ``.json``.
  Two epochs of four samples: ``solved`` (calls add(2, 3), answers 5: correct), ``failed``
  (calls divide(1, 0), whose ToolError the model sees, then gives up: incorrect), ``errored``
  (calls crash(), which raises: the sample errors) and ``limited`` (calls add forever with new
  arguments until the message limit of 6 cuts it). Scorers: ``includes`` (the primary) and
  ``style``, a dict value {"short": "yes"/"no", "calls": number of tool calls / 4}.
* ``OUT_DIR/set/``: an eval of two tasks into one directory, ``arith`` and ``count`` (one sample,
  two epochs, cut by a token limit of 100): a directory import makes one run of each.
* ``OUT_DIR/rescored/``: the ``.eval`` log scored again by Inspect's ``score`` with ``lenient``
  (every sample correct), its scores overwritten, as ``inspect score`` rewrites a log.

Token counts: every output carries its usage, so mockllm never counts tokens itself; its counter
loads tiktoken's o200k_base file, a download this machine cannot make. Prints a JSON summary of
what Inspect itself recorded (its metrics and its model usage), for the test to compare with.
"""
import json
import sys
from pathlib import Path

from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.log import list_eval_logs, read_eval_log
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import Score, Target, includes, mean, scorer
from inspect_ai.solver import TaskState, generate, use_tools
from inspect_ai.tool import ToolError, tool


@tool
def add():
    async def execute(x: int, y: int):
        """Add two integers.

        Args:
            x: The first integer.
            y: The second integer.
        """
        return str(x + y)
    return execute


@tool
def divide():
    async def execute(x: int, y: int):
        """Divide x by y.

        Args:
            x: The dividend.
            y: The divisor.
        """
        if y == 0:
            raise ToolError("division by zero")
        return str(x / y)
    return execute


@tool
def crash():
    async def execute():
        """A tool that fails."""
        raise RuntimeError("the tool's backend is down")
    return execute


@scorer(metrics={"short": [mean()], "calls": [mean()]})
def style():
    async def score(state: TaskState, target: Target) -> Score:
        calls = sum(len(m.tool_calls or []) for m in state.messages if m.role == "assistant")
        short = "yes" if len(state.output.completion) < 30 else "no"
        return Score(value={"short": short, "calls": calls / 4})
    return score


def outputs(messages, tools, tool_choice, config):
    """What the model says: chosen by the sample's question and what happened so far."""
    question, last = messages[0].text, messages[-1]
    n = len(messages)
    if last.role == "tool" and question.startswith("solved"):
        out = ModelOutput.from_content("mockllm", f"The answer is {last.text}")
    elif last.role == "tool" and question.startswith("failed"):
        out = ModelOutput.from_content("mockllm", "I could not work it out, sorry about that.")
    elif question.startswith("solved"):
        out = ModelOutput.for_tool_call("mockllm", "add", {"x": 2, "y": 3})
    elif question.startswith("failed"):
        out = ModelOutput.for_tool_call("mockllm", "divide", {"x": 1, "y": 0})
    elif question.startswith("errored"):
        out = ModelOutput.for_tool_call("mockllm", "crash", {})
    else:  # limited, count: new arguments every time, never an answer
        out = ModelOutput.for_tool_call("mockllm", "add", {"x": n, "y": 1})
    out.usage = ModelUsage(input_tokens=10 * n, output_tokens=7, total_tokens=10 * n + 7)
    return out


def arith() -> Task:
    return Task(name="arith",
                dataset=[Sample(id="solved", input="solved: what is 2+3?", target="5"),
                         Sample(id="failed", input="failed: what is 1/0?", target="undefined"),
                         Sample(id="errored", input="errored: what is 4+4?", target="8"),
                         Sample(id="limited", input="limited: count up", target="done")],
                solver=[use_tools(add(), divide(), crash()), generate()],
                scorer=[includes(), style()], epochs=2, message_limit=6)


def count() -> Task:
    return Task(name="count", dataset=[Sample(id="c1", input="count: up to ten", target="10")],
                solver=[use_tools(add()), generate()], scorer=includes(), epochs=2,
                token_limit=100)


def run(tasks, log_dir: Path, log_format: str) -> None:
    model = get_model("mockllm/model", custom_outputs=outputs)
    inspect_eval(tasks, model=model, log_dir=str(log_dir), log_format=log_format,
                 display="none", fail_on_error=False, max_tasks=1)


def summary(log_dir: Path) -> dict:
    out = {}
    for info in list_eval_logs(str(log_dir)):
        log = read_eval_log(info.name)
        out[Path(info.name).name] = {
            "task": log.eval.task, "model": log.eval.model, "status": log.status,
            "metrics": {f"{s.name}/{m.name}": m.value for s in log.results.scores
                        for m in s.metrics.values()},
            "usage": {k: v.model_dump() for k, v in log.stats.model_usage.items()},
            "samples": {f"{s.id}:epoch{s.epoch}": {
                "limit": s.limit.type if s.limit else None, "error": bool(s.error),
                "scores": {k: v.value for k, v in (s.scores or {}).items()}}
                for s in log.samples}}
    return out


@scorer(metrics=[mean()])
def lenient():
    """Every sample correct: a rescoring that changes what ``includes`` said of the failures."""
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value="C", answer=state.output.completion[:40], explanation="lenient")
    return score


def rescore(log_dir: Path, out_dir: Path) -> None:
    """The ``.eval`` log of ``log_dir`` scored again by ``lenient`` (Inspect's own ``score``,
    as ``inspect score`` does, its scores overwritten), written to ``out_dir`` under its name."""
    from inspect_ai import score
    from inspect_ai.log import write_eval_log
    (info,) = list_eval_logs(str(log_dir))
    log = score(read_eval_log(info.name), lenient(), action="overwrite", display="none")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_eval_log(log, str(out_dir / Path(info.name).name))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    run(arith(), out / "eval", "eval")
    run(arith(), out / "json", "json")
    run([arith(), count()], out / "set", "eval")
    rescore(out / "eval", out / "rescored")
    print(json.dumps({d: summary(out / d) for d in ("eval", "json", "set", "rescored")}))
