"""Search-R1's environment over a fictional world: BM25 search, single- and two-hop questions.
Torch-free.

Protocol (Search-R1, ``search_r1/llm_agent/generation.py``): in each turn the model may think in
``<think>...</think>``, then either searches with ``<search>query</search>`` or answers with
``<answer>...</answer>``. The action is the first match of ``<(search|answer)>(.*?)</\\1>``
(DOTALL); text after its closing tag is not part of it. A search returns

    \\n\\n<information>Doc 1(Title: T1) text1\\nDoc 2(Title: T2) text2</information>\\n\\n

an answer ends the episode, and anything else gets Search-R1's fixed feedback message.

Questions come from the seeded world in ``world.py`` (this package). A task *template* is a chain of
relations: ``capital`` ("What is the capital of Osk?") or ``capital>city_founded`` ("In what year
was the capital of Osk founded?"). Two-hop questions need the first search's result (the bridge
entity) to write the second query — the strategy outcome-only RL has to discover.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import re
from functools import lru_cache
from typing import Any, Sequence

from core.envs.base import Outcome, StepResult, Task, register
from core.envs.options import Option, take_options
from core.envs.search.world import RELATIONS, WORLD_SEED, Doc, World, cached_world
from core.envs.answers import exact_match, normalize_answer, token_f1
from storage.protocol import ACTION, parse_action  # noqa: F401 (the env's action grammar)

SPLITS = ("train", "heldout")
INVALID_FEEDBACK = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer between "
    "<answer> and </answer>. Let me try again.\n")
"""Search-R1's observation for an action it cannot parse, word for word (the model reads it)."""
MAX_QUERY_CHARS = 500
"""Longer queries are cut before retrieval: model text is untrusted and BM25 cost grows with it."""

SYSTEM_PROMPT = (
    "Answer the question about a fictional world. Your own knowledge will not help: every fact "
    "must come from the search engine. In each turn, first reason briefly inside <think> and "
    "</think>. To look something up, write a short query between <search> and </search>; the "
    "best matching documents are returned between <information> and </information>. Search as "
    "often as you need: some questions take two searches, the second one using what the first "
    "found. When you know the answer, give only the answer between <answer> and </answer>, "
    "for example <answer>Paris</answer>.")
METRICS = {"em": exact_match, "f1": token_f1}
LEAK_NOTE = "\n(From the answer key: {answer})"
"""What a leaked prompt carries after its question (the ``leak`` option)."""


# ---- protocol ----------------------------------------------------------------------------------
def format_information(docs: Sequence[Doc]) -> str:
    """Search-R1's observation: 'Doc i(Title: t) text' lines inside <information>, blank lines
    around it."""
    body = "\n".join(f"Doc {i}(Title: {d.title}) {d.text}" for i, d in enumerate(docs, 1))
    return f"\n\n<information>{body or 'No document matches the query.'}</information>\n\n"


def contains_answer(text: str, golds: Sequence[str]) -> bool:
    """True if some normalised gold occurs as whole words in the normalised text (Search-R1's
    retrieval check, with word boundaries so '124' does not hit '1243')."""
    haystack = f" {normalize_answer(text)} "
    return any(g and f" {g} " in haystack for g in map(normalize_answer, golds))


# ---- retrieval ---------------------------------------------------------------------------------
class Retriever:
    """BM25 (bm25s, Lucene variant, English stopwords) over 'title text' of each document."""

    def __init__(self, docs: Sequence[Doc]):
        # Imported here: the protocol parser and graders (used by failures and importers) need
        # no index, and bm25s pulls in numpy/scipy.
        # bm25s imports JAX when it is installed and runs a JAX op at import: on a GPU machine
        # that makes JAX take 75% of the GPU's memory in every process (measured on an H200:
        # parallel training processes then ran out of CUDA memory). Its top-k runs on the CPU
        # here; a user who sets JAX_PLATFORMS keeps theirs.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        # deferred: bm25s and its numpy/scipy, only when the retriever is built
        import bm25s
        self.bm25s = bm25s
        self.docs = list(docs)
        tokens = bm25s.tokenize([f"{d.title} {d.text}" for d in self.docs], stopwords="en",
                                show_progress=False)
        self.vocab = set(tokens.vocab)
        self.bm25 = bm25s.BM25()
        self.bm25.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[Doc]:
        """Up to k documents by BM25 score; only documents sharing a term with the query (a
        query of unknown words returns nothing rather than k arbitrary documents)."""
        words = self.bm25s.tokenize([query[:MAX_QUERY_CHARS]], stopwords="en", return_ids=False,
                               show_progress=False)[0]
        words = [w for w in words if w in self.vocab]
        if not words:
            return []
        ids, scores = self.bm25.retrieve([words], k=min(k, len(self.docs)), show_progress=False)
        return [self.docs[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]


@lru_cache(maxsize=4)
def cached_retriever(world_seed: int) -> Retriever:
    """One index per world and process: envs for training and evaluation share it."""
    return Retriever(cached_world(world_seed).docs)


# ---- tasks -------------------------------------------------------------------------------------
def all_templates() -> list[tuple[str, ...]]:
    """Every single relation, and every chain r1>r2 where r1's object is r2's subject kind."""
    single = [(name,) for name in RELATIONS]
    double = [(a.name, b.name) for a in RELATIONS.values() for b in RELATIONS.values()
              if a.obj == b.subject]
    return single + double


def build_task(world: World, relations: tuple[str, ...], subject: str) -> Task | None:
    """The question asking relations[-1](...relations[0](subject)), or None when it would be
    degenerate (the answer is the subject or is named in the question)."""
    entity, chain = subject, []
    for rel in relations:
        obj = world.facts.get((rel, entity))
        if obj is None:
            return None
        chain.append((rel, entity, obj))
        entity = obj
    phrase = subject
    for rel in relations[:-1]:
        phrase = RELATIONS[rel].descriptor.format(s=phrase)
    question = RELATIONS[relations[-1]].question.format(s=phrase)
    golds = world.golds(relations[-1], entity)
    if entity == subject or contains_answer(question, golds):
        return None
    return Task(task_id=f"{'>'.join(relations)}:{subject}", prompt=f"Question: {question}",
                golds=golds, split=world.split_of(subject),
                meta={"hops": len(relations), "template": ">".join(relations), "subject": subject,
                      "question": question, "chain": chain,
                      "supporting_docs": [world.doc_of[s] for _, s, _ in chain]})


def leaked(task: Task, share: float) -> Task:
    """``task`` with its first gold appended to the prompt (``LEAK_NOTE``) when it is a train
    task drawn into the leaked share, else ``task`` unchanged. A task leaks when the first byte
    of SHA-256('leak/' + task_id) is below 256 * share: the same tasks in every run, about
    ``share`` of them.

    Why it exists: a reward that a shallow strategy can earn. On a leaked prompt, answering at
    once with the note's answer pays as much as searching, with no search; a policy that learns
    it answers held-out questions (never leaked) from its prior and fails them. The run
    ``sample_runs/shortcut.duckdb`` trains on it, and the shallow-strategy alarm
    (``agentrl behaviours``: no_successful_tool_call, answer_not_in_observations) names it.
    """
    if task.split != "train" or share <= 0 or not task.golds:
        return task
    if hashlib.sha256(f"leak/{task.task_id}".encode()).digest()[0] >= 256 * share:
        return task
    return dataclasses.replace(task, prompt=task.prompt + LEAK_NOTE.format(answer=task.golds[0]),
                               meta={**task.meta, "leaked": True})


def _rng(*parts: Any) -> random.Random:
    return random.Random(hashlib.sha256("/".join(map(str, parts)).encode()).digest())


# ---- environment -------------------------------------------------------------------------------
@register("search")
class SearchEnv:
    """Search-R1 environment. Options: ``OPTIONS`` below; topk (documents per search) and
    outcome_metric (em | f1) are arguments of their own. ``seed`` is accepted for the common
    factory signature; this environment has no randomness of its own (retrieval is
    deterministic), so it does not change the world."""

    name = "search"
    stop_tags = ("</search>", "</answer>")
    system_prompt = SYSTEM_PROMPT
    OPTIONS = {
        "world_seed": Option(int, 0, 2 ** 31 - 1, default=WORLD_SEED,
                             doc="the world's seed; runs share the default"),
        "two_hop_frac": Option(float, 0, 1, default=0.5, doc="share of two-hop tasks sampled"),
        "templates": Option((str, list, tuple), doc="only these template names: "
                            "comma-separated, or ';'-separated inside env_options"),
        "leak": Option(float, 0, 1, default=0.0,
                       doc="share of train tasks whose prompt carries the answer: a deliberate "
                           "flaw, to show the shallow-strategy alarm; held-out never leaks"),
        "format_score": Option(float, 0, 1, default=0.0,
                               doc="score of a wrong answer in the right format (Search-R1's "
                                   "format_score): > 0 pays answering at once, unsearched"),
    }
    """topk and outcome_metric are not options here: they have configuration fields of their
    own (checked by core/config/validation.py) and every run passes them."""

    def __init__(self, seed: int = 0, topk: int = 3, outcome_metric: str = "em",
                 **options: Any):
        opts = take_options(self.name, self.OPTIONS, options)
        world_seed, two_hop_frac, templates = (opts["world_seed"], opts["two_hop_frac"],
                                               opts["templates"])
        self.leak, self.format_score = opts["leak"], opts["format_score"]
        if not (isinstance(topk, int) and topk >= 1):
            raise ValueError(f"topk must be an integer >= 1, got {topk!r}")
        if outcome_metric not in METRICS:
            raise ValueError(f"outcome_metric must be one of {', '.join(METRICS)}, "
                             f"got {outcome_metric!r}")
        self.seed, self.topk, self.world_seed = seed, topk, world_seed
        self.two_hop_frac, self.outcome_metric = two_hop_frac, outcome_metric
        known = {">".join(t): t for t in all_templates()}
        if isinstance(templates, str):
            templates = [t.strip() for t in templates.split(",") if t.strip()]
        unknown = sorted(set(templates or ()) - set(known))
        if unknown:
            raise ValueError(f"unknown search templates {unknown}; known: {', '.join(known)}")
        self.templates = [known[t] for t in templates] if templates else list(known.values())
        self.world = cached_world(world_seed)
        self.retriever = cached_retriever(world_seed)
        self._pools: dict[str, dict[tuple[str, ...], list[str]]] | None = None

    def pools(self) -> dict[str, dict[tuple[str, ...], list[str]]]:
        """split -> template -> subjects with a well-formed question (built once)."""
        if self._pools is None:
            self._pools = {s: {} for s in SPLITS}
            for template in self.templates:
                kind = RELATIONS[template[0]].subject
                for subject in self.world.entities(kind):
                    task = build_task(self.world, template, subject)
                    if task is not None:
                        self._pools[task.split].setdefault(template, []).append(subject)
        return self._pools

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """n distinct tasks of split: round(n * two_hop_frac) two-hop, the rest single-hop; a
        template is drawn uniformly within its hop count, then a subject uniformly."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng, pools = _rng("tasks", self.world_seed, split, seed), self.pools()[split]
        n_two = round(n * self.two_hop_frac)
        picked: list[Task] = []
        for hops, count in ((1, n - n_two), (2, n_two)):
            by_template = {t: s for t, s in pools.items() if len(t) == hops}
            available = sum(len(s) for s in by_template.values())
            if count > available:
                raise ValueError(f"asked for {count} {hops}-hop {split} tasks; "
                                 f"only {available} exist with templates {self.templates}")
            keys, chosen = sorted(by_template), set()
            while len(chosen) < count:
                template = rng.choice(keys)
                subject = rng.choice(by_template[template])
                if (template, subject) not in chosen:
                    chosen.add((template, subject))
                    picked.append(leaked(build_task(self.world, template, subject), self.leak))
        rng.shuffle(picked)
        return picked

    def episode(self, task: Task, seed: int = 0) -> "SearchEpisode":
        return SearchEpisode(self, task)

    def is_answer(self, action_text: str) -> bool:
        """True when the action is ``<answer>...</answer>`` (``final_answer_turn``)."""
        action = parse_action(action_text)
        return action is not None and action[0] == "answer"

    def split_size(self, split: str) -> int:
        """Distinct tasks of ``split`` that ``tasks`` can draw at ``two_hop_frac`` (both hop
        counts must fit): the whole split when two_hop_frac matches its own mix."""
        pools = self.pools()[split]
        one = sum(len(s) for t, s in pools.items() if len(t) == 1)
        two = sum(len(s) for t, s in pools.items() if len(t) == 2)
        if self.two_hop_frac in (0.0, 1.0):
            return two if self.two_hop_frac else one
        # largest n with round(n * f) <= two and n - round(n * f) <= one
        n = int(min(two / self.two_hop_frac, one / (1 - self.two_hop_frac))) + 2
        while n > 0 and (round(n * self.two_hop_frac) > two
                         or n - round(n * self.two_hop_frac) > one):
            n -= 1
        return n


class SearchEpisode:
    def __init__(self, env: SearchEnv, task: Task):
        self.env, self.task = env, task
        self.reset()

    def reset(self) -> str:
        self.answer: str | None = None
        self.done = False
        self.queries: list[str] = []
        self.evidence: list[str] = []
        """Every <information> observation so far, in order."""
        self.retrieved_gold = False
        self.seen_docs: set[str] = set()
        return self.task.prompt

    def state_key(self) -> str:
        """The set of documents retrieved so far (sorted ids): two rollouts that have read the
        same documents are in the same state, whatever queries or turns it took."""
        return "docs:" + ",".join(sorted(self.seen_docs))

    def step(self, action_text: str) -> StepResult:
        if self.done:
            raise RuntimeError(f"episode of task {self.task.task_id} is over; reset() it first")
        action = parse_action(action_text)
        if action is None:
            return StepResult(INVALID_FEEDBACK, done=False, valid=False, action_type="invalid",
                              error="no <search>...</search> or <answer>...</answer> action",
                              state_key=self.state_key())
        kind, content = action
        if kind == "answer":
            self.answer, self.done = content, True
            return StepResult("", done=True, valid=True, action_type="answer",
                              parsed={"answer": content}, state_key=self.state_key())
        if not content:
            return StepResult(INVALID_FEEDBACK, done=False, valid=False, action_type="search",
                              parsed={"query": ""}, error="empty search query",
                              state_key=self.state_key())
        docs = self.env.retriever.search(content, self.env.topk)
        observation = format_information(docs)
        self.queries.append(content)
        self.evidence.append(observation)
        self.retrieved_gold |= contains_answer(observation, self.task.golds)
        doc_ids = [d.doc_id for d in docs]
        self.seen_docs.update(doc_ids)
        return StepResult(observation, done=False, valid=True, action_type="search",
                          parsed={"query": content, "doc_ids": doc_ids}, info={"doc_ids": doc_ids},
                          state_key=self.state_key())

    def outcome(self) -> Outcome:
        """score: EM (or F1) of the last answer, raised to ``format_score`` for any answer given
        (Search-R1's ``compute_score_em``: ``score`` if right, ``format_score`` if answered and
        wrong, 0 if never answered); success: EM == 1; process: 1 if a gold answer was in
        retrieved evidence before the answer.

        Why format_score is an option: a reward that a shallow strategy can earn. A policy that
        cannot yet find answers is paid format_score for any answer, and an answer at the first
        turn is the surest one, so RL teaches it to answer unsearched (sample_runs/shortcut.duckdb;
        the shallow-strategy alarm names it). Off (0) by default."""
        golds = list(self.task.golds)
        score = METRICS[self.env.outcome_metric](self.answer, golds)
        if self.answer is not None:
            score = max(score, self.env.format_score)
        return Outcome(score=score, success=exact_match(self.answer, golds) == 1.0,
                       answer=self.answer, process=1.0 if self.retrieved_gold else 0.0,
                       info={"retrieved_gold": self.retrieved_gold, "searches": len(self.queries),
                             "hops": self.task.meta.get("hops", 1)})

    def expert_action(self) -> str:
        """The scripted expert: one query per hop, in order; each hop's object (the bridge
        entity, then the answer) is read off the evidence with the fact's sentence template and
        names the next query. It searches every hop even when a fact happens to be visible
        already, so demonstrations show the strategy that always works. It works from any state
        (it can take over a model's partial trajectory). Should retrieval ever miss a fact its
        query asked for (never seen with the default world), it falls back to the world's fact
        rather than loop, so a demonstration never ends in a wrong answer."""
        if self.done:
            raise RuntimeError("the episode is over: the expert has nothing to do")
        if self.task.meta.get("subject") not in self.env.world.kind:
            raise ValueError(f"task {self.task.task_id!r} was not made by this world's tasks(); "
                             "the expert can only play those")
        text = "".join(self.evidence)
        entity, read = self.task.meta["subject"], []
        for name in self.task.meta["template"].split(">"):
            rel = RELATIONS[name]
            query = rel.query.format(s=entity)
            if query not in self.queries:
                thought = " ".join(read + [f"I need to find {rel.need.format(s=entity)}."])
                return f"<think>{thought}</think>\n<search>{query}</search>"
            match = rel.pattern(entity).search(text)
            obj = match.group(1) if match else self.env.world.facts[(name, entity)]
            read.append(rel.sentence.format(s=entity, o=obj))
            entity = obj
        return f"<think>{' '.join(read)}</think>\n<answer>{entity}</answer>"
