"""A live Inspect AI evaluation for tests/test_follow_inspect.py: it writes its log while the
test's follower watches the directory. Run as a script, in a process of its own:

    python tests/inspect_live.py LOG_DIR GATE_FILE [eval|json]

Task ``live``, Inspect's offline ``mockllm`` model (tests/inspect_logs.py says why every output
carries its usage) and real tools, two samples run side by side: ``quick`` calls add(2, 3) and
answers 5 at once; ``gated`` calls wait_gate(), a tool that returns only once GATE_FILE exists,
then answers. ``log_buffer=1``: Inspect writes each finished sample into the log as it ends, so
the log holds ``quick`` (still unfinished: no header.json, status started) for as long as the
test keeps the gate shut, and both samples with the results once it opens it.
"""
import asyncio
import sys
from pathlib import Path

from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import tool

from inspect_logs import add

GATE_TIMEOUT_S = 120


@tool
def wait_gate():
    async def execute():
        """Wait until the operator opens the gate."""
        gate = Path(sys.argv[2])
        for _ in range(GATE_TIMEOUT_S * 20):
            if gate.exists():
                return "the gate is open"
            await asyncio.sleep(0.05)
        raise RuntimeError("the gate never opened")
    return execute


def outputs(messages, tools, tool_choice, config):
    question, last, n = messages[0].text, messages[-1], len(messages)
    if last.role == "tool":
        out = ModelOutput.from_content("mockllm", "5" if question.startswith("quick")
                                       else "opened")
    elif question.startswith("quick"):
        out = ModelOutput.for_tool_call("mockllm", "add", {"x": 2, "y": 3})
    else:
        out = ModelOutput.for_tool_call("mockllm", "wait_gate", {})
    out.usage = ModelUsage(input_tokens=10 * n, output_tokens=7, total_tokens=10 * n + 7)
    return out


def live() -> Task:
    return Task(name="live",
                dataset=[Sample(id="quick", input="quick: what is 2+3?", target="5"),
                         Sample(id="gated", input="gated: open the gate", target="opened")],
                solver=[use_tools(add(), wait_gate()), generate()], scorer=includes())


if __name__ == "__main__":
    model = get_model("mockllm/model", custom_outputs=outputs)
    fmt = sys.argv[3] if len(sys.argv) > 3 else "eval"
    logs = inspect_eval(live(), model=model, log_dir=sys.argv[1], log_format=fmt,
                        display="none", log_buffer=1, max_samples=2)
    print(logs[0].status)
