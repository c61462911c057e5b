"""A trajectory's transcript: the exact tokens the model saw, written turn by turn with their
roles and loss mask. Rollouts (core/rollout/engine.py) and the SFT demonstrations (core/rollout/sft.py) both
build trajectories through these functions, so their prompts, observation wrapping, truncation
and masks are the same.

Chat templates: environments produce plain text. The prompt is rendered with the policy
tokenizer's own chat template; so is every observation of an env whose ``observation_role`` is
``user`` (a new user message closing the model's turn and opening the next; RAGEN's games).
``inline`` observations (Search-R1's ``<information>``) continue the model's own message verbatim.

Roles and the loss mask: prompt and observation tokens are untrained; the model's own (action)
tokens are trained.
"""
from __future__ import annotations

from core.rollout.episode import end_reason
from core.rollout.sampling import Sampling
from core.rollout.trajectory import Trajectory, Turn


def prompt_ids(tokenizer, system: str, user: str) -> list[int]:
    """The chat-templated prompt ending with the assistant header (add_generation_prompt)."""
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": user}]
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)
    text = "\n\n".join(m["content"] for m in messages) + "\n\n"
    return tokenizer.encode(text, add_special_tokens=False)


_ACTION_MARK = "\x00ACTION\x00"


def user_turn_text(tokenizer, text: str, final: bool = False) -> str:
    """``text`` as the next user message after the model's action, in the tokenizer's own chat
    template: what the template renders after an assistant message's content (its end marker),
    then the user message, then (unless ``final``) the generation prompt. Without a template:
    ``\\n\\n{text}\\n\\n``, like ``prompt_ids``."""
    if not getattr(tokenizer, "chat_template", None):
        return f"\n\n{text}\n\n"
    messages = [{"role": "user", "content": "."}, {"role": "assistant", "content": _ACTION_MARK},
                {"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=not final,
                                             tokenize=False)
    return rendered[rendered.index(_ACTION_MARK) + len(_ACTION_MARK):]


def record_turn(traj: Trajectory, tok, turn: int, action: str, action_ids: list[int],
                action_logprobs: list[float | None] | None, result, sampling: Sampling,
                latency: float = 0.0, action_truncated: bool = False,
                state_key: str | None = None, role: str = "inline",
                ) -> tuple[list[int], str | None]:
    """Append one turn (action tokens, observation tokens, Turn record) to ``traj``.

    The observation is cut to ``max_obs_tokens``; a ``user`` one is then wrapped in the
    tokenizer's chat template (``user_turn_text``), and the whole cut to the room left in
    ``max_context``. ``state_key`` is the state the turn acted from.
    Returns (observation token ids, finish reason or None while the episode goes on).
    """
    append_tokens(traj, action_ids, "action", turn, logprobs=action_logprobs)
    obs_ids = tok.encode(result.observation, add_special_tokens=False) if result.observation else []
    truncated = len(obs_ids) > sampling.max_obs_tokens
    obs_ids = obs_ids[:sampling.max_obs_tokens]
    shown = tok.decode(obs_ids) if truncated else result.observation
    if role == "user" and result.observation:
        wrapped = user_turn_text(tok, shown, final=result.done)
        obs_ids = tok.encode(wrapped, add_special_tokens=False)
        special = set(getattr(tok, "all_special_ids", ()) or ())
        if action_ids and action_ids[-1] in special:  # the action already ended with EOS:
            end = tok.convert_ids_to_tokens(action_ids[-1])  # do not close the turn twice
            if isinstance(end, str) and wrapped.startswith(end):
                obs_ids = tok.encode(wrapped[len(end):], add_special_tokens=False)
    room = sampling.max_context - len(traj.token_ids) - (0 if result.done else 1)
    full = len(obs_ids) > room
    if full:
        obs_ids, truncated = obs_ids[:max(room, 0)], True
    append_tokens(traj, obs_ids, "observation", turn)
    if full:  # cut for room: store what the context got (markers and all)
        shown = tok.decode(obs_ids)
    traj.turns.append(Turn(
        turn=turn, action=action, observation=shown,
        valid=result.valid, action_type=result.action_type, parsed=result.parsed,
        error=result.error, state_diff=result.state_diff, obs_truncated=truncated,
        action_truncated=action_truncated, latency_s=latency, step_reward=result.reward,
        action_tokens=len(action_ids), state_key=state_key, info=dict(result.info or {})))
    if result.done:
        return obs_ids, end_reason(result)
    if full or len(traj.token_ids) >= sampling.max_context:
        return obs_ids, "context_full"
    return obs_ids, None


def append_tokens(traj: Trajectory, ids: list[int], role: str, turn: int,
            logprobs: list[float | None] | None = None) -> None:
    traj.token_ids.extend(ids)
    traj.roles.extend([role] * len(ids))
    traj.trained.extend([role == "action"] * len(ids))
    traj.logprobs.extend(logprobs if logprobs is not None else [None] * len(ids))
    traj.token_turn.extend([turn] * len(ids))
